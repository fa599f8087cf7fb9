// SPDX-License-Identifier: Apache-2.0
// Causal GQA attention over the fp32 KV cache (ops.h `attention`). One simple kernel for prefill and decode: a
// block of kWarps warps per (query row, head); warp w takes keys lo + w, lo + w + kWarps, …, its 32 lanes split the
// head dimension (lane holds dims lane, lane + 32, …), and it keeps an online softmax (running max m, running sum
// l, running weighted value sum) in fp32 — the rescaling trick of FlashAttention (Dao et al., 2022), which is
// exact up to rounding. The warps' (m, l, acc) are merged in shared memory at the end. Decode (t = 1) gets one
// block per head, which keeps every key row read once per query head; the GQA sharing of a key row between the
// H/KVH heads of a group goes through L2. Not a fast kernel: a correct one that the CPU kernel checks.
#include <cmath>
#include <string>

#include "backends/cuda/kernels/cuda_check.h"
#include "backends/cuda/kernels/ops.h"
#include "backends/cuda/kernels/ops_launch.h"

namespace fp4serve::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kPerLane = static_cast<int>(kMaxAttentionHeadDim / 32);

__device__ inline int64_t cache_row(const PagedRows& paged, int64_t p) {
  if (paged.block_table == nullptr) return p;
  return static_cast<int64_t>(paged.block_table[p / paged.block_size]) * paged.block_stride + p % paged.block_size;
}

__global__ void attention_kernel(const float* q, int64_t start_pos, const float* k_cache, const float* v_cache,
                                 int64_t cache_row_stride, int64_t num_heads, int64_t group, int64_t head_dim,
                                 float scale, int64_t window, const float* sinks, float* out, PagedRows paged) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kMaxAttentionHeadDim];

  const int64_t row = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t kvh = h / group;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t q_pos = start_pos + row;
  const int64_t lo = window > 0 && q_pos - window + 1 > 0 ? q_pos - window + 1 : 0;

  const float* qh = q + (row * num_heads + h) * head_dim;
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
  for (int64_t p = lo + warp; p <= q_pos; p += kWarps) {
    const int64_t cr = cache_row(paged, p);
    const float* kr = k_cache + cr * cache_row_stride + kvh * head_dim;
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < head_dim) dot += qv[j] * kr[d];
    }
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float s = scale * dot;
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new);  // 0 on the first key (m = −inf)
    const float w = expf(s - m_new);
    l = l * correction + w;
    const float* vr = v_cache + cr * cache_row_stride + kvh * head_dim;
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

  // Every query sees at least its own key, so the merged max is finite.
  float big = sinks != nullptr ? sinks[h] : -INFINITY;
  for (int w = 0; w < kWarps; ++w) big = fmaxf(big, warp_max[w]);
  float denom = sinks != nullptr ? expf(sinks[h] - big) : 0.0f;
  float factor[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    factor[w] = expf(warp_max[w] - big);  // 0 for a warp that saw no key
    denom += warp_sum[w] * factor[w];
  }
  float* oh = out + (row * num_heads + h) * head_dim;
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += warp_acc[w][d] * factor[w];
    oh[d] = sum / denom;
  }
}

}  // namespace

void attention(const float* q, int64_t t, int64_t start_pos, const float* k_cache, const float* v_cache,
               int64_t cache_row_stride, const AttentionShape& shape, float* out, cudaStream_t stream,
               const PagedRows& paged) {
  if (shape.head_dim > kMaxAttentionHeadDim) {
    throw UnsupportedError("CUDA attention: head_dim " + std::to_string(shape.head_dim) + " exceeds the kernel's " +
                           std::to_string(kMaxAttentionHeadDim));
  }
  detail::require(t >= 0 && start_pos >= 0 && shape.head_dim >= 1 && shape.num_heads >= 1 && shape.num_kv_heads >= 1 &&
                      shape.num_heads % shape.num_kv_heads == 0 && shape.sliding_window >= 0,
                  "attention",
                  "heads " + std::to_string(shape.num_heads) + " / kv heads " + std::to_string(shape.num_kv_heads) +
                      ", head_dim " + std::to_string(shape.head_dim) + ", t " + std::to_string(t));
  detail::require(cache_row_stride >= shape.num_kv_heads * shape.head_dim, "attention",
                  "cache row stride " + std::to_string(cache_row_stride) + " < kv_heads * head_dim");
  detail::require(t <= 0x7fffffff && shape.num_heads <= 65535, "attention", "grid too large");
  detail::require(paged.block_table == nullptr || (paged.block_size >= 1 && paged.block_stride >= paged.block_size),
                  "attention",
                  "paged block size " + std::to_string(paged.block_size) + ", block stride " +
                      std::to_string(paged.block_stride));
  if (t == 0) return;
  const dim3 grid(static_cast<unsigned>(t), static_cast<unsigned>(shape.num_heads));
  attention_kernel<<<grid, kWarps * 32, 0, stream>>>(q, start_pos, k_cache, v_cache, cache_row_stride,
                                                     shape.num_heads, shape.num_heads / shape.num_kv_heads,
                                                     shape.head_dim, shape.scale, shape.sliding_window, shape.sinks,
                                                     out, paged);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4serve::kernels::cuda
