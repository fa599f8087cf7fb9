// SPDX-License-Identifier: Apache-2.0
// The GPU ops that mixture-of-experts blocks and online transforms need beyond ops.h (ops_moe.cu): the expert
// combine (weighted scatter-add of expert outputs into their tokens' rows), GPT-OSS's swiglu expert activation,
// Qwen2-MoE's sigmoid-gated shared expert, a fill, and the online Hadamard / dense block rotations of
// compressed-tensors transforms. Same contract as ops.h: device pointers, asynchronous on `stream`, host-side
// argument checks throw UsageError before anything is launched; each op's formula is its CPU kernel's (the test
// oracle, tests/backends/cuda/kernels/ops_moe_cuda_test.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp4serve::kernels::cuda {

/// out[rows[r], c] += y[r, c] · weights[r] for r < n, c < width (one expert's combine; rows distinct, so no two
/// threads add to one element). y: [n, width]; rows: [n] int64; weights: [n] f32; out: [*, width].
void scatter_add_rows(const float* y, int64_t width, const int64_t* rows, const float* weights, int64_t n, float* out,
                      cudaStream_t stream);

/// GPT-OSS swiglu as kernels::swiglu_oai_and_mul: g = min(gate, limit), u = clamp(up, −limit, limit),
/// out = (u + 1) · g · sigmoid(alpha · g). x: [m, 2·inter] (gate | up halves); out: [m, inter]. limit > 0.
void swiglu_oai_and_mul(const float* x, int64_t m, int64_t inter, float alpha, float limit, float* out,
                        cudaStream_t stream);

/// out[t, c] += sigmoid(gate[t]) · y[t, c] for t < m, c < width. gate: [m]; y, out: [m, width].
void add_sigmoid_gated(const float* y, const float* gate, int64_t m, int64_t width, float* out, cudaStream_t stream);

/// x[i] = value for i < n.
void fill(float* x, int64_t n, float value, cudaStream_t stream);

/// In place, each `block`-wide slice of the columns [0, width) of `rows` rows `stride` floats apart:
/// slice ← slice · H_b/√b (kernels::fwht_blocks: Sylvester order, normalized). block: a power of two in
/// [2, 4096] dividing width; width ≤ stride. One thread block per (row, slice) in shared memory.
void fwht_blocks(float* x, int64_t rows, int64_t width, int64_t stride, int64_t block, cudaStream_t stream);

/// In place, slice ← slice · M with M [block, block] f32 row-major (out_j = Σ_i x_i · M[i, j], kernels::
/// rotate_blocks), on the same strided slices as fwht_blocks. block in [1, 4096] dividing width.
void rotate_blocks(float* x, int64_t rows, int64_t width, int64_t stride, const float* matrix, int64_t block,
                   cudaStream_t stream);

}  // namespace fp4serve::kernels::cuda
