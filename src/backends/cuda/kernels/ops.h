// SPDX-License-Identifier: Apache-2.0
// The model ops of the dense Llama-family decoder on an NVIDIA GPU (ops_*.cu): everything a forward step needs
// besides the linear layers (linear_cuda.h). Host-callable; every pointer argument is device memory, every call is
// asynchronous on `stream` (nullptr = the legacy default stream) and checks its launch with
// FP4SERVE_CUDA_CHECK_LAUNCH (DeviceError on failure). Host-side argument checks throw UsageError before anything
// is launched.
//
// Numeric contract: activations between ops are fp32 (not bf16) so that the GPU decoder follows the CPU decoder
// (model::Decoder, the oracle) op for op with the same rounding points; only the GEMM inputs are rounded to bf16
// (f32_to_bf16), which is where the GPU path differs from the CPU path. The KV cache is fp32 (the CPU's may be 16-bit:
// --kv-cache-dtype), laid out [layer][position][kv_heads · head_dim] per slot (the host cache keeps each KV
// head's positions together instead). Each op's formula is the CPU kernel's
// (src/backends/cpu/kernels/*.h), which cites its transformers source; the CPU kernels are the test oracle
// (tests/backends/cuda/kernels/ops_cuda_test.cpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/kernels/limits.h"

namespace fp4serve::kernels::cuda {

/// Element type of an embedding table kept on the device.
enum class TableType : uint8_t {
  Bf16,  ///< the checkpoint's BF16 bits, uploaded unchanged
  F32,   ///< F32 tables, and F16 tables widened on the host (exact)
};

/// out[i, :] = scale · table[ids[i], :] widened to fp32. table: [vocab, dim] of `type`; ids: [count] int32;
/// out: [count, dim] f32. An id outside [0, vocab) writes a row of NaN (the caller validates ids on the host
/// first, as model::CudaDecoder does, so that it can throw UsageError naming the id). `scale` is Granite's
/// embedding_multiplier (1 elsewhere); the CPU decoder multiplies after the gather, which is the same rounding.
void embedding_gather(const void* table, TableType type, int64_t vocab, int64_t dim, const int32_t* ids,
                      int64_t count, float scale, float* out, cudaStream_t stream);

/// HF LlamaRMSNorm, as kernels::rms_norm: out = weight · (x · rsqrt(mean(x²) + eps)), fp32, one block per row.
/// x, out: [rows, dim] f32 (out may alias x); weight: [dim] f32. Qwen3's per-head q/k norm is this call with
/// rows = tokens · heads and dim = head_dim.
void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out,
              cudaStream_t stream);

/// In-place NeoX rotary embedding of the first rotary_dim dims of each head, as kernels::apply_rope with
/// RopeLayout::NeoX: (x_i, x_{i+r/2}) ← (x_i·cos_i − x_{i+r/2}·sin_i, x_{i+r/2}·cos_i + x_i·sin_i).
/// x: [tokens, heads, head_dim] f32; positions: [tokens] int64 (device), each < max_positions;
/// cos_table, sin_table: [max_positions, rotary_dim/2] f32, the rows of model::RopeCache uploaded once (so the
/// default / linear / llama3 / yarn scalings are computed by the same host code as on the CPU).
void apply_rope_neox(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                     const int64_t* positions, const float* cos_table, const float* sin_table, cudaStream_t stream);

/// The gated MLP activation, as kernels::silu_and_mul: x [m, 2·inter] f32 with gate | up halves per row;
/// out [m, inter] f32, must not alias x.
void silu_and_mul(const float* x, int64_t m, int64_t inter, float* out, cudaStream_t stream);

/// x[i] += alpha · delta[i] for i < n (the residual add; alpha is Granite's residual_multiplier, else 1).
void add_scaled(float* x, const float* delta, float alpha, int64_t n, cudaStream_t stream);

/// Row copy with optional index maps: dst[dst_row(r) · dst_stride + c] = src[src_row(r) · src_stride + c] for
/// r < rows, c < width, where src_row(r) = src_rows ? src_rows[r] : r and likewise for dst (int64, device).
/// Strides in floats, ≥ width. Used to split q|k|v, to append keys/values at their cache rows, and to pick the
/// rows whose logits are wanted.
void copy_rows(const float* src, int64_t src_stride, const int64_t* src_rows, float* dst, int64_t dst_stride,
               const int64_t* dst_rows, int64_t rows, int64_t width, cudaStream_t stream);

/// out[i] = bf16(x[i]) round-to-nearest-even (the GEMM input, linear_cuda.h). x: [n] f32; out: [n] bf16.
void f32_to_bf16(const float* x, int64_t n, __nv_bfloat16* out, cudaStream_t stream);

/// Shapes and options of one attention call (the fields of kernels::AttentionParams).
struct AttentionShape {
  int64_t num_heads;
  int64_t num_kv_heads;  ///< divides num_heads; head h reads KV head h / (num_heads / num_kv_heads)
  int64_t head_dim;      ///< ≤ kMaxAttentionHeadDim
  float scale;
  int64_t sliding_window = 0;     ///< 0 = full causal; else keys p with q_pos − W < p ≤ q_pos
  const float* sinks = nullptr;   ///< [num_heads] f32 on the device (GPT-OSS), or nullptr
};

/// Causal attention of one sequence over its fp32 KV cache, as kernels::attention (same arguments, same masks):
/// out[i, h, :] = Σ_p softmax_p(scale · q[i, h]·k[p, kvh]) · v[p, kvh] over p ≤ start_pos + i (and within the
/// window). q: [t, H, D] f32; k_cache, v_cache: rows 0 … start_pos + t − 1 filled, row p at p · cache_row_stride
/// floats; out: [t, H, D] f32. One thread block per (query row, head), serving prefill (t > 1) and decode
/// (t = 1) alike: each of its warps takes every fourth key, computes the dot product across its lanes and keeps
/// an online (running max) softmax; the warps' partial results are merged at the end. The softmax is fp32 with
/// expf. Throws UnsupportedError when head_dim > kMaxAttentionHeadDim, UsageError on inconsistent sizes.
/// Paged: the key/value row of position p is block_table[p / block_size] · block_stride + p % block_size (rows
/// from k_cache / v_cache); block_table is device memory covering positions 0 … start_pos + t − 1 (entries before
/// the window may be kNoBlock: never read).
struct PagedRows {
  const int32_t* block_table = nullptr;  ///< nullptr: row p is p (contiguous)
  int64_t block_size = 0;
  int64_t block_stride = 0;  ///< rows between consecutive blocks
};

void attention(const float* q, int64_t t, int64_t start_pos, const float* k_cache, const float* v_cache,
               int64_t cache_row_stride, const AttentionShape& shape, float* out, cudaStream_t stream,
               const PagedRows& paged = {});

/// A batch of decode rows (one new token each, from different sequences) for attention_decode. Every pointer is
/// device memory and every per-row value is read on the device, so one launch serves any batch and a CUDA graph
/// that captured it stays valid while the contents change (graph.h): only the addresses are baked.
struct DecodeAttentionBatch {
  const float* q = nullptr;        ///< [rows, H, D] f32
  const float* k_cache = nullptr;  ///< key row r at k_cache + r · cache_row_stride (this layer's cache)
  const float* v_cache = nullptr;
  int64_t cache_row_stride = 0;    ///< floats, ≥ kv_heads · head_dim
  const int64_t* seq_base = nullptr;  ///< [rows] cache row of position 0 of each row's sequence (unpaged)
  /// Paged (block_tables not null, seq_base unused): row i's position p is at cache row
  /// block_tables[i · table_width + p / block_size] · block_stride + p % block_size.
  const int32_t* block_tables = nullptr;
  int64_t table_width = 0;
  int64_t block_size = 0;
  int64_t block_stride = 0;
  const int32_t* seq_len = nullptr;   ///< [rows] keys visible to the row's query: its position + 1, ≥ 1
  int64_t rows = 0;
  int64_t max_len = 0;  ///< an upper bound of every seq_len (host); sizes the split
};

/// Floats of the workspace attention_decode needs for `splits` splits (plan_kv_splits, partition.h):
/// rows · H · splits · (D + 2) — each split's running max, sum and unnormalized value sum.
int64_t attention_decode_workspace_floats(int64_t rows, int64_t num_heads, int64_t head_dim, int64_t splits);

/// Decode attention split over the KV length (flash-decoding): out[i, h, :] = Σ_p softmax_p(scale · q[i, h] ·
/// k[p]) · v[p] over the keys of row i (seq_base[i] + 0 … seq_len[i] − 1, the last sliding_window of them when
/// set; sinks join the softmax denominator), the same function as attention() with t = 1 and start_pos =
/// seq_len − 1. Grid (splits, H, rows): each block takes one key range of split_key_range (partition.h) with an
/// online softmax, writes (max, sum, Σ w·v) to `workspace`; a second kernel merges the splits of each (row, head)
/// in split order (deterministic). splits = 1 is valid (one range). workspace: ≥
/// attention_decode_workspace_floats floats. Throws UnsupportedError when head_dim > kMaxAttentionHeadDim,
/// UsageError on inconsistent sizes, splits outside [1, kMaxKvSplits] or a missing pointer with rows > 0.
void attention_decode(const DecodeAttentionBatch& batch, const AttentionShape& shape, int64_t splits,
                      float* workspace, int64_t workspace_floats, float* out, cudaStream_t stream);

}  // namespace fp4serve::kernels::cuda
