// SPDX-License-Identifier: Apache-2.0
// Structured (signs · (A ⊗ H_p) · signs) online transforms: the factorization of stored matrices
// (quant/hadamard_factor.h) and the kernel that applies them (kernels::kronecker_hadamard_blocks through
// model::TransformCache), each against float64 math written here: y = x · M̂ block-diagonally, M̂[i][j] =
// W[perm[i]][perm[j]] (ᵀ when inverse) / √n. Matrices: synthetic ones with the shapes compressed-tensors builds
// (n = 576 = 144·4, 1536 = 192·8, 64 = Sylvester) and, from tests/data/transforms (tools/reference/fx_hadamard.py),
// the very matrices compressed-tensors 0.19's random_hadamard_matrix / deterministic_hadamard_matrix return.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <random>

#include "backends/cpu/cpu_linear.h"
#include "checkpoint/safetensors.h"
#include "model/online_transform.h"
#include "quant/hadamard_factor.h"
#include "quant/formats.h"
#include "test_support.h"

namespace fp4serve::model {
namespace {

using test_support::random_x;
using test_support::view_of;

double h_of(int64_t i, int64_t j) { return (std::popcount(static_cast<uint64_t>(i & j)) & 1) ? -1.0 : 1.0; }

// W[i][j] = l[i] · r[j] · A[i/p][j/p] · H_p[i%p][j%p] with A, l, r random ±1 (seeded).
std::vector<double> kron_matrix(int64_t k, int64_t p, bool signs, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t n = k * p;
  std::vector<double> a(static_cast<size_t>(k * k)), l(static_cast<size_t>(n), 1.0), r(static_cast<size_t>(n), 1.0);
  for (double& v : a) v = (rng() & 1) ? -1.0 : 1.0;
  if (signs) {
    for (double& v : l) v = (rng() & 1) ? -1.0 : 1.0;
    for (double& v : r) v = (rng() & 1) ? -1.0 : 1.0;
  }
  std::vector<double> w(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      w[static_cast<size_t>(i * n + j)] = l[static_cast<size_t>(i)] * r[static_cast<size_t>(j)] *
                                          a[static_cast<size_t>((i / p) * k + j / p)] * h_of(i % p, j % p);
    }
  }
  return w;
}

std::vector<uint16_t> to_bf16(const std::vector<double>& w) {
  std::vector<uint16_t> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = quant::float_to_bf16(static_cast<float>(w[i]));
  return out;
}

std::vector<double> bf16_values(const std::vector<uint16_t>& w) {
  std::vector<double> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = quant::bf16_to_float(w[i]);
  return out;
}

std::vector<int64_t> random_perm(int64_t n, uint32_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  std::mt19937 rng(seed);
  std::shuffle(p.begin(), p.end(), rng);
  return p;
}

// Checks the CPU's apply_transform(t) against y = x · M̂ in float64 (M̂ from the stored values w, perm, inverse,
// scale) with an error bound of fp32 rounding on the sum of |terms|.
void expect_matches_float64(const std::shared_ptr<const OnlineTransform>& t, const std::vector<double>& w, const std::vector<int64_t>& perm,
                            int64_t n, bool inverse, double scale, int64_t rows, int64_t dim, uint32_t seed,
                            int64_t row_step = 1) {
  const std::vector<float> x = random_x(rows * dim, seed);
  std::vector<float> y = x;
  backends::cpu::apply_transform(backends::cpu::make_cpu_transform(t), y.data(), rows, dim);
  auto pi = [&](int64_t i) { return perm.empty() ? i : perm[static_cast<size_t>(i)]; };
  double worst = 0.0;
  std::vector<int64_t> checked;  // every row_step-th row and the last
  for (int64_t r = 0; r < rows; r += row_step) checked.push_back(r);
  if (checked.back() != rows - 1) checked.push_back(rows - 1);
  for (const int64_t r : checked) {
    for (int64_t base = 0; base < dim; base += n) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0, mag = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t a = inverse ? j : i, c = inverse ? i : j;
          const double term = static_cast<double>(x[static_cast<size_t>(r * dim + base + i)]) *
                              w[static_cast<size_t>(pi(a) * n + pi(c))] * scale;
          acc += term;
          mag += std::fabs(term);
        }
        const double got = y[static_cast<size_t>(r * dim + base + j)];
        const double err = std::fabs(got - acc);
        worst = std::max(worst, err / (mag + 1e-30));
        ASSERT_LE(err, 4e-6 * mag + 1e-6) << "row " << r << " block at " << base << " column " << j;
      }
    }
  }
  ::testing::Test::RecordProperty("worst_relative_error", std::to_string(worst));
}

struct Shape {
  int64_t k, p;
};

TEST(KroneckerFactor, CompressedTensorsShapesFactorWithTheirSylvesterOrder) {
  // 576 = H_144 ⊗ H_4 and 1536 = H_192 ⊗ H_8 are what compressed-tensors' table gives; 36·16 and 12·128 are other
  // producers' choices; 1·64 is a signed Sylvester (random-hadamard of a power of two).
  for (const Shape s : {Shape{144, 4}, Shape{36, 16}, Shape{192, 8}, Shape{12, 128}, Shape{1, 64}, Shape{3, 16}}) {
    const int64_t n = s.k * s.p;
    SCOPED_TRACE(::testing::Message() << "k " << s.k << " p " << s.p);
    const std::vector<double> w = kron_matrix(s.k, s.p, true, static_cast<uint32_t>(n + s.k));
    const auto f = quant::factor_kronecker_hadamard(w, n, quant::transform_storage_rel_tol(core::DType::BF16));
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->p, s.p);
    EXPECT_EQ(f->k, s.k);
    for (int64_t i = 0; i < n; i += 7) {
      for (int64_t j = 0; j < n; j += 5) {
        const double recon = f->left[static_cast<size_t>(i)] * f->right[static_cast<size_t>(j)] *
                             f->a[static_cast<size_t>((i / s.p) * s.k + j / s.p)] * h_of(i % s.p, j % s.p);
        ASSERT_EQ(recon, w[static_cast<size_t>(i * n + j)]) << i << ", " << j;
      }
    }
  }
}

TEST(KroneckerFactor, NonHadamardMatricesAreNotFactored) {
  const int64_t n = 64;
  // A random orthogonal matrix (Gram–Schmidt of a seeded Gaussian, in float64).
  std::mt19937 rng(5);
  std::normal_distribution<double> g(0.0, 1.0);
  std::vector<double> q(static_cast<size_t>(n * n));
  for (double& v : q) v = g(rng);
  for (int64_t i = 0; i < n; ++i) {
    double* row = q.data() + i * n;
    for (int64_t j = 0; j < i; ++j) {
      const double* prev = q.data() + j * n;
      double d = 0;
      for (int64_t c = 0; c < n; ++c) d += row[c] * prev[c];
      for (int64_t c = 0; c < n; ++c) row[c] -= d * prev[c];
    }
    double norm = 0;
    for (int64_t c = 0; c < n; ++c) norm += row[c] * row[c];
    for (int64_t c = 0; c < n; ++c) row[c] /= std::sqrt(norm);
  }
  EXPECT_FALSE(quant::factor_kronecker_hadamard(q, n, quant::transform_storage_rel_tol(core::DType::F64)));
  // A structured matrix with one element off by more than BF16 rounding (2^-7 relative): refused; within half an
  // ulp of BF16 it is the same BF16 value and accepted.
  std::vector<double> w = kron_matrix(12, 16, true, 3);
  const double tol = quant::transform_storage_rel_tol(core::DType::BF16);
  w[static_cast<size_t>(77 * 192 + 130)] *= 1.0 + 4 * tol;
  EXPECT_FALSE(quant::factor_kronecker_hadamard(w, 192, tol));
  w[static_cast<size_t>(77 * 192 + 130)] /= 1.0 + 4 * tol;
  w[static_cast<size_t>(77 * 192 + 130)] *= 1.0 + tol / 2;
  EXPECT_TRUE(quant::factor_kronecker_hadamard(w, 192, tol));
  // One sign flipped: no p verifies.
  std::vector<double> flipped = kron_matrix(1, 64, true, 4);
  flipped[static_cast<size_t>(5 * 64 + 9)] = -flipped[static_cast<size_t>(5 * 64 + 9)];
  EXPECT_FALSE(quant::factor_kronecker_hadamard(flipped, 64, tol));
}

TEST(KroneckerTransform, MatchesFloat64WithSignsPermutationAndInverse) {
  for (const Shape s : {Shape{1, 64}, Shape{144, 4}, Shape{192, 8}, Shape{36, 16}}) {
    const int64_t n = s.k * s.p;
    for (const bool signs : {false, true}) {
      for (const bool inverse : {false, true}) {
        for (const bool permuted : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "n " << n << " k " << s.k << " signs " << signs << " inverse " << inverse
                                          << " perm " << permuted);
          if (s.k == 1 && !signs && !permuted) continue;  // exact Sylvester: the Fwht kernel (online_transform_test)
          const std::vector<uint16_t> stored = to_bf16(kron_matrix(s.k, s.p, signs, static_cast<uint32_t>(n * 3 + signs)));
          const std::vector<int64_t> perm = permuted ? random_perm(n, static_cast<uint32_t>(n + inverse)) : std::vector<int64_t>{};
          TransformSource src{"x.v_input.weight", "random-hadamard", inverse, view_of(stored, core::DType::BF16, {n, n}),
                              std::nullopt};
          if (permuted) src.perm = view_of(perm, core::DType::I64, {n});
          TransformCache cache;
          const auto t = cache.get(src);
          ASSERT_EQ(t->kernel(), TransformKernel::KroneckerHadamard);
          ASSERT_NE(t->structured(), nullptr);
          EXPECT_EQ(t->structured()->k, s.k);
          EXPECT_EQ(t->structured()->p, s.p);
          const int64_t rows = n <= 64 ? 5 : 3, dim = n <= 64 ? 3 * n : n;  // odd rows; several blocks per row
          expect_matches_float64(t, bf16_values(stored), perm, n, inverse, 1.0 / std::sqrt(double(n)), rows, dim,
                                 static_cast<uint32_t>(n + 11 * inverse + 5 * permuted));
        }
      }
    }
  }
}

TEST(KroneckerTransform, ManyRowsCrossTheKernelsChunksAndStridedSlicesKeepTheirNeighbours) {
  // 1536-wide blocks: 21 vectors per 32 K-float chunk, so 45 rows take three chunks, the last one partial.
  const int64_t k = 192, p = 8, n = k * p;
  const std::vector<double> w = kron_matrix(k, p, true, 17);
  std::vector<float> stored(w.begin(), w.end());
  const std::vector<int64_t> perm = random_perm(n, 23);
  TransformSource src{"x.v_input.weight", "random-hadamard", false, view_of(stored, core::DType::F32, {n, n}),
                      view_of(perm, core::DType::I64, {n})};
  TransformCache cache;
  const auto t = cache.get(src);
  ASSERT_EQ(t->kernel(), TransformKernel::KroneckerHadamard);
  // Rows 0, 7, …, 42 and 44: both chunk boundaries (21, 42) and the partial last chunk, at a fifth of the cost.
  expect_matches_float64(t, w, perm, n, false, 1.0 / std::sqrt(double(n)), 45, n, 31, 7);
  // A 1536-wide slice of 1600-float rows: the 64 columns after it are untouched.
  const int64_t rows = 3, stride = n + 64;
  std::vector<float> x = random_x(rows * stride, 41);
  const std::vector<float> before = x;
  backends::cpu::apply_transform_strided(backends::cpu::make_cpu_transform(t), x.data(), rows, n, stride);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = n; c < stride; ++c) ASSERT_EQ(x[static_cast<size_t>(r * stride + c)], before[static_cast<size_t>(r * stride + c)]);
  }
  std::vector<float> slice(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(before.begin() + r * stride, n, slice.begin() + r * n);
  }
  backends::cpu::apply_transform(backends::cpu::make_cpu_transform(t), slice.data(), rows, n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < n; ++c) ASSERT_EQ(x[static_cast<size_t>(r * stride + c)], slice[static_cast<size_t>(r * n + c)]);
  }
}

TEST(KroneckerTransform, RandomOrthogonalAndRandomMatrixTypesStayDense) {
  const int64_t n = 48;
  std::mt19937 rng(9);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> m(static_cast<size_t>(n * n));
  for (float& v : m) v = g(rng);
  TransformCache cache;
  const auto t = cache.get({"x.u_input.weight", "random-matrix", false, view_of(m, core::DType::F32, {n, n}), std::nullopt});
  EXPECT_EQ(t->kernel(), TransformKernel::Dense);
  EXPECT_EQ(t->structured(), nullptr);
}

// The matrices compressed-tensors itself builds (tools/reference/fx_hadamard.py).
TEST(KroneckerTransform, CompressedTensorsOwnHadamardMatricesAreRecognizedAndExact) {
  const std::filesystem::path path =
      std::filesystem::path(FP4SERVE_TEST_DATA) / "transforms" / "ct-hadamard.safetensors";
  const checkpoint::SafetensorsFile file(path);
  auto tensor = [&](const std::string& name) {
    const checkpoint::TensorEntry* e = file.find(name);
    if (e == nullptr) throw std::runtime_error("fixture lacks " + name);
    return file.view(*e);
  };
  struct Case {
    std::string name;
    int64_t k, p;  // the factorization expected: compressed-tensors' known H_K times Sylvester H_p
    std::string perm;
    bool inverse;
  };
  const std::vector<Case> cases{
      {"random-hadamard.576.bf16", 144, 4, "", false},    {"random-hadamard.576.f32", 144, 4, "perm.576", true},
      {"random-hadamard.576.f64", 144, 4, "perm.576", false}, {"random-hadamard.1536.bf16", 192, 8, "perm.1536", false},
      {"random-hadamard.1536.f32", 192, 8, "", true},     {"random-hadamard.64.bf16", 1, 64, "perm.64", true},
      {"hadamard.64.bf16", 1, 64, "perm.64", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const core::TensorView w = tensor(c.name);
    const int64_t n = w.shape.at(0);
    TransformSource src{c.name, c.name.starts_with("hadamard") ? "hadamard" : "random-hadamard", c.inverse, w,
                        std::nullopt};
    std::vector<int64_t> perm;
    if (!c.perm.empty()) {
      src.perm = tensor(c.perm);
      for (int64_t i = 0; i < n; ++i) perm.push_back(src.perm->load<int64_t>(static_cast<size_t>(i)));
    }
    TransformCache cache;
    const auto t = cache.get(src);
    ASSERT_EQ(t->kernel(), TransformKernel::KroneckerHadamard);
    EXPECT_EQ(t->structured()->k, c.k);
    EXPECT_EQ(t->structured()->p, c.p);
    std::vector<double> values(static_cast<size_t>(n * n));
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = w.dtype == core::DType::BF16   ? quant::bf16_to_float(w.load<uint16_t>(i))
                  : w.dtype == core::DType::F32 ? w.load<float>(i)
                                                : w.load<double>(i);
    }
    expect_matches_float64(t, values, perm, n, c.inverse, 1.0 / std::sqrt(double(n)), 3, n, 7);
  }
}

}  // namespace
}  // namespace fp4serve::model
