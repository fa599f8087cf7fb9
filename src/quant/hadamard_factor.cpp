// SPDX-License-Identifier: Apache-2.0
#include "quant/hadamard_factor.h"

#include <bit>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/tensor_view.h"
#include "fp4serve/error.h"

namespace fp4serve::quant {
namespace {

inline double sylvester(int64_t h, int64_t g) {
  return (std::popcount(static_cast<uint64_t>(h & g)) & 1) ? -1.0 : 1.0;
}

inline int8_t sign_of(double v) { return v < 0 ? int8_t{-1} : int8_t{1}; }

// One candidate p. G = W ∘ (1 ⊗ H_p) must be left[i]·right[j]·A[i/p][j/p]: A is read off the first element of
// every block (where left = right = +1 by the normalization), each row's signs off the block column holding
// that block row's largest |A| entry, each column's off the block row holding the column's largest; then every
// element is checked, so a wrong guess can only fail, never pass.
std::optional<KroneckerHadamardFactors> try_factor(std::span<const double> w, int64_t n, int64_t p, double rel_tol) {
  const int64_t k = n / p;
  auto g = [&](int64_t i, int64_t j) { return w[static_cast<size_t>(i * n + j)] * sylvester(i % p, j % p); };
  KroneckerHadamardFactors f;
  f.p = p;
  f.k = k;
  f.a.resize(static_cast<size_t>(k * k));
  for (int64_t a = 0; a < k; ++a) {
    for (int64_t b = 0; b < k; ++b) f.a[static_cast<size_t>(a * k + b)] = g(a * p, b * p);
  }
  auto at = [&](int64_t a, int64_t b) { return f.a[static_cast<size_t>(a * k + b)]; };
  f.left.assign(static_cast<size_t>(n), 1);
  f.right.assign(static_cast<size_t>(n), 1);
  for (int64_t a = 0; a < k; ++a) {
    int64_t best = 0;
    for (int64_t b = 1; b < k; ++b) {
      if (std::fabs(at(a, b)) > std::fabs(at(a, best))) best = b;
    }
    if (at(a, best) == 0.0) return std::nullopt;
    for (int64_t h = 0; h < p; ++h) {
      f.left[static_cast<size_t>(a * p + h)] = static_cast<int8_t>(sign_of(g(a * p + h, best * p)) * sign_of(at(a, best)));
    }
  }
  for (int64_t b = 0; b < k; ++b) {
    int64_t best = 0;
    for (int64_t a = 1; a < k; ++a) {
      if (std::fabs(at(a, b)) > std::fabs(at(best, b))) best = a;
    }
    if (at(best, b) == 0.0) return std::nullopt;
    for (int64_t h = 0; h < p; ++h) {
      f.right[static_cast<size_t>(b * p + h)] = static_cast<int8_t>(sign_of(g(best * p, b * p + h)) * sign_of(at(best, b)));
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const double recon = f.left[static_cast<size_t>(i)] * f.right[static_cast<size_t>(j)] * at(i / p, j / p) *
                           sylvester(i % p, j % p);
      const double stored = w[static_cast<size_t>(i * n + j)];
      if (!(std::fabs(recon - stored) <= rel_tol * std::fabs(recon))) return std::nullopt;
    }
  }
  return f;
}

}  // namespace

std::optional<KroneckerHadamardFactors> factor_kronecker_hadamard(std::span<const double> w, int64_t n,
                                                                   double rel_tol) {
  if (n < 2 || w.size() != static_cast<size_t>(n) * static_cast<size_t>(n)) return std::nullopt;
  // Largest p first: the bigger the Sylvester factor, the smaller the dense A (K = n/p) left to multiply.
  for (int64_t p = n & -n; p >= 2; p /= 2) {
    if (auto f = try_factor(w, n, p, rel_tol)) return f;
  }
  return std::nullopt;
}

double transform_storage_rel_tol(core::DType dtype) {
  if (dtype == core::DType::BF16) return std::ldexp(1.0, -8);
  if (dtype == core::DType::F16) return std::ldexp(1.0, -11);
  if (dtype == core::DType::F32) return std::ldexp(1.0, -24);
  if (dtype == core::DType::F64) return std::ldexp(1.0, -53);
  throw UsageError(
      fmt::format("transform_storage_rel_tol: {} is not a transform matrix dtype", core::dtype_name(dtype)));
}

KroneckerHadamardSteps kronecker_hadamard_steps(const KroneckerHadamardFactors& f, std::span<const int64_t> perm,
                                                     bool inverse, double scale) {
  const int64_t n = f.k * f.p;
  if (!perm.empty() && perm.size() != static_cast<size_t>(n)) {
    throw UsageError(fmt::format("kronecker_hadamard_steps: a perm of {} entries for n = {}", perm.size(), n));
  }
  auto pi = [&](int64_t i) { return perm.empty() ? i : perm[static_cast<size_t>(i)]; };
  // out_j = scale · Σ_i x_i · W[π(i)][π(j)] = scale · (y·W)[π(j)] with y[π(i)] = x_i; inverse: (y·Wᵀ)[π(j)],
  // Wᵀ = diag(right)·(Aᵀ ⊗ H_p)·diag(left), so the sign sides swap and A is transposed.
  const std::vector<int8_t>& first = inverse ? f.right : f.left;
  const std::vector<int8_t>& last = inverse ? f.left : f.right;
  KroneckerHadamardSteps t;
  t.n = n;
  t.p = f.p;
  t.k = f.k;
  t.in_index.resize(static_cast<size_t>(n));
  t.in_sign.resize(static_cast<size_t>(n));
  t.out_index.resize(static_cast<size_t>(n));
  t.out_scale.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t q = pi(i);
    t.in_index[static_cast<size_t>(q)] = static_cast<int32_t>(i);
    t.in_sign[static_cast<size_t>(q)] = first[static_cast<size_t>(q)];
  }
  const double a00 = f.k == 1 ? f.a[0] : 1.0;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t q = pi(j);
    t.out_index[static_cast<size_t>(j)] = static_cast<int32_t>((q % f.p) * f.k + q / f.p);
    t.out_scale[static_cast<size_t>(j)] = static_cast<float>(scale * a00 * last[static_cast<size_t>(q)]);
  }
  if (f.k > 1) {
    // W_lin[a'][a] = B[a][a'] with B = A (or Aᵀ): W_lin = Aᵀ, or A itself when inverse.
    std::vector<float> lin(static_cast<size_t>(f.k * f.k));
    for (int64_t r = 0; r < f.k; ++r) {
      for (int64_t c = 0; c < f.k; ++c) {
        const double v = inverse ? f.a[static_cast<size_t>(r * f.k + c)] : f.a[static_cast<size_t>(c * f.k + r)];
        lin[static_cast<size_t>(r * f.k + c)] = static_cast<float>(v);
      }
    }
    t.mix = std::move(lin);
  }
  return t;
}

}  // namespace fp4serve::quant
