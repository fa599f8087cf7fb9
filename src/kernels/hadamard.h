// SPDX-License-Identifier: Apache-2.0
// Block-diagonal Hadamard / dense rotations on CPU (cpu/hadamard.cpp), for the online transforms of
// compressed-tensors `transform_config` (FORMATS.md §1.8) and QuaRot/SpinQuant-style activation rotation.
#pragma once

#include <cstdint>

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

}  // namespace fp4serve::kernels
