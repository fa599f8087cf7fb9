// SPDX-License-Identifier: Apache-2.0
// Online transforms against float64 math written here: y = x · M̂ block-diagonally, M̂ = W[perm][:, perm] (ᵀ when
// inverse) / √b for the Hadamard types, unscaled for random-matrix (compressed-tensors HadamardTransform /
// RandomMatrixTransform). Kernel choice (FWHT only for an exact Sylvester matrix) and sharing are checked too.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <memory>
#include <random>

#include "backends/cpu/cpu_linear.h"
#include "fp4serve/error.h"
#include "model/online_transform.h"
#include "test_support.h"

namespace fp4serve::model {
namespace {

using test_support::random_x;
using test_support::sylvester;
using test_support::view_of;

// y = x · blockdiag(M) with M[i][j] = W[p[r]][p[c]] · s, (r, c) = (i, j) or (j, i) when inverse.
std::vector<double> reference(const std::vector<float>& x, int64_t rows, int64_t dim, const std::vector<double>& w,
                              const std::vector<int64_t>& p, int64_t b, bool inverse, double s) {
  std::vector<double> y(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t blk = 0; blk < dim / b; ++blk) {
      for (int64_t j = 0; j < b; ++j) {
        double acc = 0.0;
        for (int64_t i = 0; i < b; ++i) {
          const int64_t a = inverse ? j : i, c = inverse ? i : j;
          acc += static_cast<double>(x[static_cast<size_t>(r * dim + blk * b + i)]) *
                 w[static_cast<size_t>(p[static_cast<size_t>(a)] * b + p[static_cast<size_t>(c)])] * s;
        }
        y[static_cast<size_t>(r * dim + blk * b + j)] = acc;
      }
    }
  }
  return y;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  double max_diff = 0.0;
  for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
  EXPECT_LE(max_diff, tol);
}

TEST(OnlineTransform, SylvesterHadamardRunsAsFwhtAndMatchesTheDenseDefinition) {
  for (const int64_t b : {16, 128}) {
    SCOPED_TRACE(b);
    const std::vector<double> h = sylvester(b);
    TransformCache cache;
    const auto t = cache.get({"x.v_input.weight", "hadamard", false, view_of(h, core::DType::F64, {b, b}), std::nullopt});
    EXPECT_EQ(t->kernel(), TransformKernel::Fwht);
    EXPECT_EQ(t->block(), b);
    const int64_t rows = 3, dim = 3 * b;
    std::vector<float> x = random_x(rows * dim, 7);
    std::vector<int64_t> id(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) id[static_cast<size_t>(i)] = i;
    const std::vector<double> want = reference(x, rows, dim, h, id, b, false, 1.0 / std::sqrt(static_cast<double>(b)));
    backends::cpu::apply_transform(backends::cpu::make_cpu_transform(t), x.data(), rows, dim);
    expect_close(x, want, 1e-5);
  }
}

TEST(OnlineTransform, PermutedInverseRandomHadamardRunsStructured) {
  const int64_t b = 32, rows = 5, dim = 96;
  std::mt19937 rng(11);
  // A random ±1 Hadamard: Sylvester with random column signs (what random_hadamard_matrix builds), in BF16.
  std::vector<double> h = sylvester(b);
  std::vector<uint16_t> stored(h.size());
  std::vector<double> w(h.size());
  for (int64_t j = 0; j < b; ++j) {
    const double sign = (rng() & 1) ? -1.0 : 1.0;
    for (int64_t i = 0; i < b; ++i) {
      const double v = h[static_cast<size_t>(i * b + j)] * sign;
      w[static_cast<size_t>(i * b + j)] = v;
      stored[static_cast<size_t>(i * b + j)] = v > 0 ? 0x3f80 : 0xbf80;  // ±1.0 in BF16
    }
  }
  std::vector<int64_t> perm(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) perm[static_cast<size_t>(i)] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  TransformCache cache;
  const auto t = cache.get({"x.v_input.weight", "random-hadamard", true, view_of(stored, core::DType::BF16, {b, b}),
                            view_of(perm, core::DType::I64, {b})});
  EXPECT_EQ(t->kernel(), TransformKernel::KroneckerHadamard);  // signs · H_32: k = 1, p = 32
  std::vector<float> x = random_x(rows * dim, 3);
  const std::vector<double> want = reference(x, rows, dim, w, perm, b, true, 1.0 / std::sqrt(static_cast<double>(b)));
  backends::cpu::apply_transform(backends::cpu::make_cpu_transform(t), x.data(), rows, dim);
  expect_close(x, want, 1e-5);
}

TEST(OnlineTransform, RandomMatrixIsAppliedUnscaled) {
  const int64_t b = 12, rows = 2, dim = 36;  // any size: not a power of two
  std::vector<float> stored = random_x(b * b, 5);
  std::vector<double> w(stored.begin(), stored.end());
  std::vector<int64_t> id(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) id[static_cast<size_t>(i)] = i;
  TransformCache cache;
  const auto t = cache.get({"x.u_input.weight", "random-matrix", false, view_of(stored, core::DType::F32, {b, b}), std::nullopt});
  EXPECT_EQ(t->kernel(), TransformKernel::Dense);
  std::vector<float> x = random_x(rows * dim, 9);
  const std::vector<double> want = reference(x, rows, dim, w, id, b, false, 1.0);
  backends::cpu::apply_transform(backends::cpu::make_cpu_transform(t), x.data(), rows, dim);
  expect_close(x, want, 1e-4);
}

TEST(OnlineTransform, IdenticalMatricesAreSharedAndDifferentOnesAreNot) {
  const int64_t b = 16;
  const std::vector<double> h = sylvester(b);
  std::vector<float> h32(h.begin(), h.end());
  std::vector<double> flipped = h;
  flipped[1] = -flipped[1];
  TransformCache cache;
  const auto a = cache.get({"a", "hadamard", false, view_of(h, core::DType::F64, {b, b}), std::nullopt});
  const auto same = cache.get({"b", "hadamard", false, view_of(h32, core::DType::F32, {b, b}), std::nullopt});
  const auto other = cache.get({"c", "hadamard", false, view_of(flipped, core::DType::F64, {b, b}), std::nullopt});
  EXPECT_EQ(a.get(), same.get());
  EXPECT_NE(a.get(), other.get());
  EXPECT_EQ(other->kernel(), TransformKernel::Dense);
  EXPECT_EQ(cache.distinct(), 2u);
}

// A source seen before is recognised by its stored bytes (no f64 re-read), but only when the type, direction, perm
// and dtype match too: each variant below must still compute its own matrix.
TEST(OnlineTransform, RepeatedSourcesAreSharedOnlyWhenEverythingMatches) {
  const int64_t b = 12, rows = 2, dim = 24;
  const std::vector<float> m = random_x(b * b, 21);
  std::vector<float> copy = m;  // another buffer, the same bytes
  std::vector<float> changed = m;
  changed[5] += 0.25f;
  std::vector<int64_t> id(static_cast<size_t>(b)), swapped(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) id[static_cast<size_t>(i)] = swapped[static_cast<size_t>(i)] = i;
  std::swap(swapped[0], swapped[3]);
  const auto view = [&](const std::vector<float>& w) { return view_of(w, core::DType::F32, {b, b}); };
  TransformCache cache;
  const auto a = cache.get({"a", "random-matrix", false, view(m), std::nullopt});
  const auto again = cache.get({"b", "random-matrix", false, view(copy), std::nullopt});
  const auto inverse = cache.get({"c", "random-matrix", true, view(m), std::nullopt});
  const auto permuted = cache.get({"d", "random-matrix", false, view(m), view_of(swapped, core::DType::I64, {b})});
  const auto identity = cache.get({"e", "random-matrix", false, view(m), view_of(id, core::DType::I64, {b})});
  const auto other = cache.get({"f", "random-matrix", false, view(changed), std::nullopt});
  const auto scaled = cache.get({"g", "random-hadamard", false, view(m), std::nullopt});
  EXPECT_EQ(a.get(), again.get());
  EXPECT_EQ(a.get(), identity.get());  // an identity perm gives the same effective matrix
  EXPECT_EQ(cache.distinct(), 5u);     // a, inverse, permuted, other, scaled
  const std::vector<double> w(m.begin(), m.end()), wc(changed.begin(), changed.end());
  struct Case {
    std::shared_ptr<const OnlineTransform> t;
    const std::vector<double>* w;
    const std::vector<int64_t>* p;
    bool inverse;
    double scale;
  };
  for (const Case& c : {Case{a, &w, &id, false, 1.0}, Case{inverse, &w, &id, true, 1.0},
                        Case{permuted, &w, &swapped, false, 1.0}, Case{other, &wc, &id, false, 1.0},
                        Case{scaled, &w, &id, false, 1.0 / std::sqrt(static_cast<double>(b))}}) {
    std::vector<float> x = random_x(rows * dim, 23);
    const std::vector<double> want = reference(x, rows, dim, *c.w, *c.p, b, c.inverse, c.scale);
    backends::cpu::apply_transform(backends::cpu::make_cpu_transform(c.t), x.data(), rows, dim);
    expect_close(x, want, 1e-4);
  }
}

TEST(OnlineTransform, MalformedMatricesAndPermsAreRejected) {
  const std::vector<double> m(12, 1.0);
  TransformCache cache;
  EXPECT_THROW(cache.get({"a", "hadamard", false, view_of(m, core::DType::F64, {3, 4}), std::nullopt}), FormatError);
  const std::vector<double> sq(16, 1.0);
  const std::vector<int64_t> dup{0, 1, 1, 3};
  EXPECT_THROW(cache.get({"a", "hadamard", false, view_of(sq, core::DType::F64, {4, 4}), view_of(dup, core::DType::I64, {4})}),
               FormatError);
  const std::vector<int64_t> short_perm{0, 1, 2};
  EXPECT_THROW(cache.get({"a", "hadamard", false, view_of(sq, core::DType::F64, {4, 4}), view_of(short_perm, core::DType::I64, {3})}),
               FormatError);
  // A valid source first, then the same bytes with a perm of the wrong shape: still rejected, not taken from the
  // cache of sources seen before.
  const std::vector<int64_t> perm{2, 0, 3, 1};
  EXPECT_NO_THROW(cache.get({"a", "hadamard", false, view_of(sq, core::DType::F64, {4, 4}), view_of(perm, core::DType::I64, {4})}));
  EXPECT_THROW(cache.get({"b", "hadamard", false, view_of(sq, core::DType::F64, {4, 4}), view_of(perm, core::DType::I64, {1, 4})}),
               FormatError);
  EXPECT_THROW(cache.get({"c", "hadamard", false, view_of(sq, core::DType::F64, {2, 8}), view_of(perm, core::DType::I64, {4})}),
               FormatError);
  EXPECT_THROW(cache.get({"a", "givens", false, view_of(sq, core::DType::F64, {4, 4}), std::nullopt}), UnsupportedError);
  std::vector<double> nan = sq;
  nan[5] = std::nan("");
  EXPECT_THROW(cache.get({"a", "hadamard", false, view_of(nan, core::DType::F64, {4, 4}), std::nullopt}), FormatError);
  const auto t = cache.get({"a", "random-matrix", false, view_of(sq, core::DType::F64, {4, 4}), std::nullopt});
  std::vector<float> x(6, 1.0f);
  EXPECT_THROW(backends::cpu::apply_transform(backends::cpu::make_cpu_transform(t), x.data(), 1, 6), UsageError);  // 4 does not divide 6
}

}  // namespace
}  // namespace fp4serve::model
