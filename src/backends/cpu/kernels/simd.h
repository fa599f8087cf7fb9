// SPDX-License-Identifier: Apache-2.0
// Internal: the Highway-vectorized inner loops of the CPU ops (simd_ops.cpp), each dispatched at run time
// to the best instruction set the CPU supports (AVX-512, AVX2, SSE4, SSSE3, or Highway's portable scalar
// target). The public op headers in src/backends/cpu/kernels/ validate arguments and call these; nothing here checks
// them. Every function accumulates in fp32 in a lane-parallel order, so results differ from a sequential loop only by
// rounding (the tests bound the difference against float64 references).
#pragma once

#include <cstdint>

#include "backends/cpu/kernels/attention.h"

namespace fp4serve::kernels::cpu {

/// Σ x[i]², fp32 lane-parallel accumulation. x: [n].
float sum_squares(const float* x, int64_t n);

/// out[i] = weight[i] · (x[i] · r); the order of the two products follows HF LlamaRMSNorm. All [n].
void scale_by_weight(const float* x, const float* weight, float r, int64_t n, float* out);

/// x[i] = exp(x[i] − shift) in place; returns Σ of the new values. Requires x[i] − shift ≤ 0 or small
/// (Highway Exp is valid on [−FLT_MAX, 104]).
float exp_shifted_sum(float* x, int64_t n, float shift);

/// max_i x[i] (−inf for n = 0). x: [n].
float max_value(const float* x, int64_t n);

/// Σ exp(x[i] − shift), x unchanged: fp32 exp, lane sums over blocks of 1024 added in float64; the same range
/// condition as exp_shifted_sum.
double exp_sum(const float* x, int64_t n, float shift);

/// out[i] = silu(gate[i]) · up[i], silu(g) = g / (1 + e^−g). All [n].
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

/// GPT-OSS "swiglu-oai" (FORMATS.md §5): g = min(gate, limit), u = clamp(up, −limit, limit),
/// out = (u + 1) · g · sigmoid(alpha · g).
void swiglu_oai_mul(const float* gate, const float* up, int64_t n, float alpha, float limit, float* out);

/// Unnormalized Walsh–Hadamard butterflies, Sylvester order, on each `block`-sized block of x[0..n), then a
/// multiply by `scale`. n is a multiple of block; block a power of two ≥ 2.
void fwht(float* x, int64_t n, int64_t block, float scale);

/// x_blk ← x_blk · M for each `block`-wide slice of x[0..n); matrix [block, block] row-major; scratch [block].
void rotate_blocks(float* x, int64_t n, const float* matrix, int64_t block, float* scratch);

/// write_kv_row (attention.h), vectorized.
void store_kv_row(const float* src, int64_t n, KvElement element, void* dst);

/// One query row of causal attention for the `group` query heads that share one KV head.
/// q: [group, d] (the group's heads, contiguous); the row attends to positions [lo, hi] of `kv_head` in `cache`
/// (contiguous or paged: attention.h KvRows).
/// sinks: [group] extra logits in the softmax denominator, or nullptr. scores: scratch of group·(hi−lo+1).
/// out: [group, d], overwritten.
/// partial: nullptr for the softmax-weighted output above; otherwise [group, 2] receives each head's max score m
/// and Σ_j exp(s_j − m) over [lo, hi], out gets the unnormalized Σ_j exp(s_j − m)·v_j, and sinks are ignored
/// (the caller merges key ranges, sinks included: attention.cpp).
void attend_group(const float* q, int64_t group, int64_t d, const KvRows& cache, int64_t kv_head, int64_t lo,
                  int64_t hi, float scale, const float* sinks, float* scores, float* out, float* partial = nullptr);

/// attention() for a prefill of t rows (attention_prefill.cpp): blocks of query rows × the heads of one KV head
/// as matrices, S = Q·Kᵀ and O = P·V on the panel GEMM's micro-kernel, keys packed once per call. Arguments as
/// attention(), already validated. Returns false (and writes nothing) on targets without the micro-kernel
/// (EMU128, an SVE length the panels do not assume); attention() then runs attend_group per row.
bool prefill_attention(const float* q, int64_t t, int64_t start_pos, const KvRows& cache, const AttentionParams& params,
                       float* out);

/// Whether prefill_attention runs its products on bf16 dot products for a cache of `element` with `params` on the
/// dispatched target (attention_prefill.cpp UsesBf16).
bool prefill_attention_bf16(KvElement element, const AttentionParams& params);

}  // namespace fp4serve::kernels::cpu
