// SPDX-License-Identifier: Apache-2.0
// Structure of a stored online-transform matrix (compressed-tensors `P.<group>_<location>.weight`, FORMATS.md
// §1.8): the Hadamard matrices compressed-tensors builds are Kronecker products of a small matrix and a Sylvester
// Hadamard with sign flips, W = diag(left) · (A ⊗ H_p) · diag(right) (`random_hadamard_matrix`: diag(±1) times the
// transpose of `_matmul_hadU`'s H_K ⊗ H_p, H_K a known Hadamard matrix of order K = n/p from its
// `hadamards.safetensors`, e.g. 144 ⊗ H_4 for n = 576, 192 ⊗ H_8 for n = 1536; `deterministic_hadamard_matrix`:
// Sylvester, K = 1). Recognized from the stored values alone, so x·W costs n·(K + log2 p) multiply-adds per
// vector instead of n².
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/dtype.h"

namespace fp4serve::quant {

/// W[i][j] = left[i] · right[j] · A[i / p][j / p] · H_p[i % p][j % p], H_p[h][h'] = (−1)^popcount(h & h')
/// (Sylvester), left/right ±1, normalized so that left[a·p] = right[a·p] = +1.
struct KroneckerHadamardFactors {
  int64_t p = 0;               ///< Sylvester order, a power of two ≥ 2
  int64_t k = 0;               ///< order of A; n = k · p
  std::vector<double> a;       ///< [k, k] row-major, the stored values of W[a·p][a'·p]
  std::vector<int8_t> left;    ///< [n] ±1
  std::vector<int8_t> right;   ///< [n] ±1
};

/// Factors the n×n row-major matrix `w` (the stored values, exactly) as above with the largest p (a power of two
/// dividing n) for which the factorization reproduces every element: |recon − w| ≤ rel_tol·|recon| (rel_tol =
/// half an ulp of the storage dtype, so recon rounded to that dtype is the stored value; a zero recon needs a
/// zero w). nullopt when no p ≥ 2 verifies (e.g. a random rotation). Costs O(n²) per p tried.
std::optional<KroneckerHadamardFactors> factor_kronecker_hadamard(std::span<const double> w, int64_t n,
                                                                   double rel_tol);

/// Half an ulp, relative, of a stored transform dtype: 2^-8 (BF16), 2^-11 (F16), 2^-24 (F32), 2^-53 (F64).
/// Throws UsageError for any other dtype.
double transform_storage_rel_tol(core::DType dtype);

/// The steps of value ← value · M̂ for M̂[i][j] = scale · W[π(i)][π(j)] (W the factored matrix, π the
/// stored permutation, identity when empty), transposed when `inverse` (model/online_transform.h), on one
/// n-vector x (each backend runs them; the CPU: kernels::kronecker_hadamard_blocks):
///   f[q] = x[in_index[q]] · in_sign[q]                        (q = a·p + h; the permutation and one sign side)
///   f ← per p-block FWHT (unnormalized Sylvester)
///   z[h][a'] = Σ_a f[a·p + h] · B[a][a']                       (B = A, or Aᵀ when inverse; `mix`, k > 1 only)
///   x[j] = z_flat[out_index[j]] · out_scale[j]                 (z_flat = f when k = 1; the other signs, scale)
struct KroneckerHadamardSteps {
  int64_t n = 0, p = 0, k = 0;
  std::vector<int32_t> in_index;   ///< [n]
  std::vector<float> in_sign;      ///< [n] ±1
  std::vector<int32_t> out_index;  ///< [n] into z [p, k] (k > 1) or f [n] (k = 1)
  std::vector<float> out_scale;    ///< [n] ±scale (×A[0][0] when k = 1)
  /// k > 1: [k, k] row-major fp32 with mix[a'·k + a] = B[a][a'] (the weight W_lin of a Linear layer, so that
  /// z = f_t · W_linᵀ = f_t · B); empty when k = 1.
  std::vector<float> mix;
};

/// Throws UsageError when `perm` is neither empty nor of length n (the caller validates it is a permutation).
KroneckerHadamardSteps kronecker_hadamard_steps(const KroneckerHadamardFactors& f, std::span<const int64_t> perm,
                                                     bool inverse, double scale);

}  // namespace fp4serve::quant
