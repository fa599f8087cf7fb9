// SPDX-License-Identifier: Apache-2.0
// Block-diagonal Hadamard / dense rotations on CPU (cpu/hadamard.cpp), for the online transforms of
// compressed-tensors `transform_config` (FORMATS.md §1.8) and QuaRot/SpinQuant-style activation rotation.
#pragma once

#include <cstdint>
#include <memory>

#include "backends/cpu/prepare/prepared_linear.h"
#include "quant/hadamard_factor.h"

namespace fp4serve::kernels {

/// Normalized fast Walsh–Hadamard transform applied independently to each `block`-wide slice of every row:
/// x_blk ← x_blk · H_b / √b with H_b the Sylvester Hadamard matrix (H_1 = [1], H_2k = [[H_k, H_k], [H_k, −H_k]]),
/// the matrix compressed-tensors' `hadamard` transform builds for power-of-two sizes. H_b is symmetric and
/// H_b/√b is orthonormal and its own inverse. log2(b) add/sub stages per element (Highway, in place).
/// x: [rows, dim] f32; block a power of two in [2, 2^15] dividing dim (16…128 are the useful sizes for FP4
/// scale groups). Rows run in parallel (OpenMP) for large inputs. Throws UsageError otherwise.
void fwht_blocks(float* x, int64_t rows, int64_t dim, int64_t block);

/// x_blk ← x_blk · M for each `block`-wide slice of every row, with a dense matrix (e.g. a random-Hadamard or
/// learned rotation loaded from `P.<group>_<location>.weight`, already divided by √b by the caller).
/// x: [rows, dim] f32; matrix: [block, block] f32 row-major, out_j = Σ_i x_i · M[i, j]; block ≥ 1 dividing dim.
/// Throws UsageError on a null pointer or bad size.
void rotate_blocks(float* x, int64_t rows, int64_t dim, const float* matrix, int64_t block);

/// The steps of a Kronecker-Hadamard transform (quant/hadamard_factor.h) as this kernel runs them: for k > 1 the
/// k×k mixing matrix in the Dense fp32 layout of kernels::linear, made once per transform.
struct KroneckerHadamardKernel {
  const quant::KroneckerHadamardSteps* steps = nullptr;  ///< not owned: must outlive the kernel
  std::shared_ptr<const prepare::PreparedLinear> mix;     ///< k > 1 only: steps->mix as a Dense F32 layer
};
/// Throws UsageError when steps.mix is not k×k (k > 1) or not empty (k = 1).
KroneckerHadamardKernel prepare_kronecker_hadamard(const quant::KroneckerHadamardSteps& steps);

/// x_blk ← x_blk · M̂ for each t.n-wide slice of every row, M̂ a signed, permuted Kronecker product of a dense
/// t.k×t.k matrix and the Sylvester H_p (quant/hadamard_factor.h gives the steps): a gather with signs, the FWHT
/// on p-blocks (Highway), then for k > 1 one GEMM of [vectors·p, k] × [k, k] (kernels::linear, Dense fp32) for the
/// k-mixing, and a gather with the output signs and scale. n·(k + log2 p) multiply-adds per slice instead of n².
/// x: [rows, dim] f32, t.n dividing dim. Slices are processed in chunks of ~32 K floats so the scratch stays in
/// cache. Throws UsageError when t.n does not divide dim, rows < 0 or x is null with rows > 0.
void kronecker_hadamard_blocks(const KroneckerHadamardKernel& kernel, float* x, int64_t rows, int64_t dim);

}  // namespace fp4serve::kernels
