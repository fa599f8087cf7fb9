// SPDX-License-Identifier: Apache-2.0
// Decode attention split over the KV length (ops.h `attention_decode`; flash-decoding, Dao et al., 2023): a
// decode row has one query per head, so attention() gives it only H blocks, each walking every key serially —
// 9 blocks for SmolLM2 on a 132-SM GPU. Here a (row, head) is cut into `splits` key ranges (partition.h), each a
// block of kWarps warps with the online softmax of ops_attention.cu (running max m, sum l, weighted value sum),
// and a second kernel rescales and adds the splits: out = Σ_s acc_s·e^(m_s − M) / (Σ_s l_s·e^(m_s − M) + sink),
// M = max(m_s, sink). Rows come from different sequences; their positions and cache rows are read on the device.
#include <cmath>
#include <string>

#include "backends/cuda/kernels/cuda_check.h"
#include "backends/cuda/kernels/ops.h"
#include "backends/cuda/kernels/ops_launch.h"
#include "backends/cuda/kernels/partition.h"

namespace fp4serve::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kPerLane = static_cast<int>(kMaxAttentionHeadDim / 32);

// workspace[((row · H + h) · splits + s) · (D + 2) + …] = m, l, acc[0 … D).
__global__ void decode_split_kernel(DecodeAttentionBatch b, int64_t num_heads, int64_t group, int64_t head_dim,
                                    float scale, int64_t window, float* workspace) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kMaxAttentionHeadDim];

  const int64_t splits = gridDim.x;
  const int64_t s = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t row = blockIdx.z;
  const int64_t kvh = h / group;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t q_pos = static_cast<int64_t>(b.seq_len[row]) - 1;
  const KeyRange range = split_key_range(q_pos, window, splits, s);
  const bool paged = b.block_tables != nullptr;
  const int32_t* table = paged ? b.block_tables + row * b.table_width : nullptr;
  // Cache row of key p: the row's block table (paged), else seq_base + p.
  const auto row_of = [&](int64_t p) {
    return paged ? static_cast<int64_t>(table[p / b.block_size]) * b.block_stride + p % b.block_size
                 : b.seq_base[row] + p;
  };
  const float* k_base = b.k_cache + kvh * head_dim;
  const float* v_base = b.v_cache + kvh * head_dim;

  const float* qh = b.q + (row * num_heads + h) * head_dim;
  float qv[kPerLane];
  float acc[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t d = lane + 32 * j;
    qv[j] = d < head_dim ? qh[d] : 0.0f;
    acc[j] = 0.0f;
  }
  float m = -INFINITY;
  float l = 0.0f;
  for (int64_t p = range.lo + warp; p < range.hi; p += kWarps) {
    const int64_t cr = row_of(p);
    const float* kr = k_base + cr * b.cache_row_stride;
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < head_dim) dot += qv[j] * kr[d];
    }
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float sc = scale * dot;
    const float m_new = fmaxf(m, sc);
    const float correction = expf(m - m_new);  // 0 on the first key (m = −inf)
    const float w = expf(sc - m_new);
    l = l * correction + w;
    const float* vr = v_base + cr * b.cache_row_stride;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < head_dim) acc[j] = acc[j] * correction + w * vr[d];
    }
    m = m_new;
  }
  if (lane == 0) {
    warp_max[warp] = m;
    warp_sum[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t d = lane + 32 * j;
    if (d < head_dim) warp_acc[warp][d] = acc[j];
  }
  __syncthreads();

  // The block's (m, l, acc) over its range; m = −inf, l = 0, acc = 0 for an empty range.
  float big = -INFINITY;
  for (int w = 0; w < kWarps; ++w) big = fmaxf(big, warp_max[w]);
  float factor[kWarps];
  float sum = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    factor[w] = big == -INFINITY ? 0.0f : expf(warp_max[w] - big);
    sum += warp_sum[w] * factor[w];
  }
  float* ws = workspace + ((row * num_heads + h) * splits + s) * (head_dim + 2);
  if (threadIdx.x == 0) {
    ws[0] = big;
    ws[1] = sum;
  }
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < kWarps; ++w) v += warp_acc[w][d] * factor[w];
    ws[2 + d] = v;
  }
}

// One block per (head, row): merges the splits in order s = 0, 1, ….
__global__ void decode_merge_kernel(int64_t num_heads, int64_t head_dim, int64_t splits, const float* sinks,
                                    const float* workspace, float* out) {
  const int64_t h = blockIdx.x;
  const int64_t row = blockIdx.y;
  const float* ws = workspace + (row * num_heads + h) * splits * (head_dim + 2);
  // Every query sees at least its own key, so some split has a finite max.
  float big = sinks != nullptr ? sinks[h] : -INFINITY;
  for (int64_t s = 0; s < splits; ++s) big = fmaxf(big, ws[s * (head_dim + 2)]);
  float denom = sinks != nullptr ? expf(sinks[h] - big) : 0.0f;
  for (int64_t s = 0; s < splits; ++s) denom += ws[s * (head_dim + 2) + 1] * expf(ws[s * (head_dim + 2)] - big);
  float* oh = out + (row * num_heads + h) * head_dim;
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float v = 0.0f;
    for (int64_t s = 0; s < splits; ++s) v += ws[s * (head_dim + 2) + 2 + d] * expf(ws[s * (head_dim + 2)] - big);
    oh[d] = v / denom;
  }
}

}  // namespace

int64_t attention_decode_workspace_floats(int64_t rows, int64_t num_heads, int64_t head_dim, int64_t splits) {
  return rows * num_heads * splits * (head_dim + 2);
}

void attention_decode(const DecodeAttentionBatch& batch, const AttentionShape& shape, int64_t splits,
                      float* workspace, int64_t workspace_floats, float* out, cudaStream_t stream) {
  if (shape.head_dim > kMaxAttentionHeadDim) {
    throw UnsupportedError("CUDA decode attention: head_dim " + std::to_string(shape.head_dim) +
                           " exceeds the kernel's " + std::to_string(kMaxAttentionHeadDim));
  }
  detail::require(batch.rows >= 0 && shape.head_dim >= 1 && shape.num_heads >= 1 && shape.num_kv_heads >= 1 &&
                      shape.num_heads % shape.num_kv_heads == 0 && shape.sliding_window >= 0,
                  "attention_decode",
                  "heads " + std::to_string(shape.num_heads) + " / kv heads " + std::to_string(shape.num_kv_heads) +
                      ", head_dim " + std::to_string(shape.head_dim) + ", rows " + std::to_string(batch.rows));
  detail::require(splits >= 1 && splits <= kMaxKvSplits, "attention_decode",
                  "splits " + std::to_string(splits) + " outside [1, " + std::to_string(kMaxKvSplits) + "]");
  detail::require(batch.cache_row_stride >= shape.num_kv_heads * shape.head_dim, "attention_decode",
                  "cache row stride " + std::to_string(batch.cache_row_stride) + " < kv_heads * head_dim");
  detail::require(batch.rows <= 65535 && shape.num_heads <= 65535, "attention_decode", "grid too large");
  if (batch.rows == 0) return;
  const int64_t need = attention_decode_workspace_floats(batch.rows, shape.num_heads, shape.head_dim, splits);
  detail::require(workspace != nullptr && workspace_floats >= need, "attention_decode",
                  "workspace of " + std::to_string(workspace_floats) + " floats, need " + std::to_string(need));
  detail::require(batch.q != nullptr && batch.k_cache != nullptr && batch.v_cache != nullptr &&
                      (batch.seq_base != nullptr || batch.block_tables != nullptr) && batch.seq_len != nullptr &&
                      out != nullptr,
                  "attention_decode", "null q, cache, seq_base (or block tables), seq_len or out");
  detail::require(batch.block_tables == nullptr ||
                      (batch.block_size >= 1 && batch.block_stride >= batch.block_size &&
                       batch.table_width * batch.block_size >= batch.max_len),
                  "attention_decode",
                  "block tables of " + std::to_string(batch.table_width) + " blocks of " +
                      std::to_string(batch.block_size) + " for " + std::to_string(batch.max_len) + " keys");
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(shape.num_heads),
                  static_cast<unsigned>(batch.rows));
  decode_split_kernel<<<grid, kWarps * 32, 0, stream>>>(batch, shape.num_heads,
                                                        shape.num_heads / shape.num_kv_heads, shape.head_dim,
                                                        shape.scale, shape.sliding_window, workspace);
  FP4SERVE_CUDA_CHECK_LAUNCH();
  decode_merge_kernel<<<dim3(static_cast<unsigned>(shape.num_heads), static_cast<unsigned>(batch.rows)), 128, 0,
                        stream>>>(shape.num_heads, shape.head_dim, splits, shape.sinks, workspace, out);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4serve::kernels::cuda
