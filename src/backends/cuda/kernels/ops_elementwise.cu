// SPDX-License-Identifier: Apache-2.0
// The row-wise and element-wise ops of ops.h: embedding gather, RMSNorm, RoPE, the SiLU-gated activation,
// residual add, row copies and the f32 → bf16 conversion. Each mirrors a CPU kernel of src/backends/cpu/kernels (the
// test oracle) formula for formula; the differences are the summation order of reductions and FMA contraction, both
// within fp32 rounding.
#include <cuda_bf16.h>

#include <cmath>
#include <string>

#include "backends/cuda/kernels/cuda_check.h"
#include "backends/cuda/kernels/ops.h"
#include "backends/cuda/kernels/ops_launch.h"

namespace fp4serve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ inline float bf16_bits_to_float(uint16_t bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 16); }

template <class T>
__device__ inline float table_value(const T* table, int64_t i);
template <>
__device__ inline float table_value<uint16_t>(const uint16_t* table, int64_t i) { return bf16_bits_to_float(table[i]); }
template <>
__device__ inline float table_value<float>(const float* table, int64_t i) { return table[i]; }

template <class T>
__global__ void embedding_kernel(const T* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t count,
                                 float scale, float* out) {
  const int64_t n = count * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / dim;
    const int64_t col = i - row * dim;
    const int32_t id = ids[row];
    // Out-of-range ids are rejected on the host; NaN makes a missed check visible rather than reading out of bounds.
    out[i] = (id < 0 || id >= vocab) ? __int_as_float(0x7fc00000) : table_value(table, id * dim + col) * scale;
  }
}

// Block-wide sum for a block of kThreads threads; every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  __syncthreads();  // partial[] is reused by the next call
  return total;
}

__global__ void rms_norm_kernel(const float* x, const float* weight, int64_t dim, float eps, float* out) {
  const float* xr = x + blockIdx.x * dim;
  float* yr = out + blockIdx.x * dim;
  float sq = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) sq += xr[i] * xr[i];
  const float mean_sq = block_sum(sq) / static_cast<float>(dim);
  // HF: hidden * torch.rsqrt(variance + eps); 1/sqrt rounds like the CPU kernel, rsqrtf would not.
  const float inv_rms = 1.0f / sqrtf(mean_sq + eps);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) yr[i] = weight[i] * (xr[i] * inv_rms);
}

__global__ void rope_neox_kernel(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t half,
                                 const int64_t* positions, const float* cos_table, const float* sin_table) {
  const int64_t n = tokens * heads * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t f = i % half;
    const int64_t th = i / half;  // token · heads + head
    const int64_t token = th / heads;
    const float c = cos_table[positions[token] * half + f];
    const float s = sin_table[positions[token] * half + f];
    float* head = x + th * head_dim;
    const float a = head[f];
    const float b = head[f + half];
    head[f] = a * c - b * s;
    head[f + half] = b * c + a * s;
  }
}

// out[r, c] = silu(x[r, c]) · x[r, inter + c]: rows of x hold gate | up, as the fused gate_up GEMM writes them.
__global__ void silu_and_mul_kernel(const float* x, int64_t m, int64_t inter, float* out) {
  const int64_t n = m * inter;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter;
    const int64_t c = i - r * inter;
    const float g = x[r * 2 * inter + c];
    out[i] = g / (1.0f + expf(-g)) * x[r * 2 * inter + inter + c];
  }
}

__global__ void add_scaled_kernel(float* x, const float* delta, float alpha, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += alpha * delta[i];
  }
}

__global__ void copy_rows_kernel(const float* src, int64_t src_stride, const int64_t* src_rows, float* dst,
                                 int64_t dst_stride, const int64_t* dst_rows, int64_t rows, int64_t width) {
  const int64_t n = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width;
    const int64_t c = i - r * width;
    const int64_t sr = src_rows != nullptr ? src_rows[r] : r;
    const int64_t dr = dst_rows != nullptr ? dst_rows[r] : r;
    dst[dr * dst_stride + c] = src[sr * src_stride + c];
  }
}

__global__ void f32_to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(x[i]);
  }
}

}  // namespace

void embedding_gather(const void* table, TableType type, int64_t vocab, int64_t dim, const int32_t* ids,
                      int64_t count, float scale, float* out, cudaStream_t stream) {
  detail::require(vocab > 0 && dim > 0 && count >= 0, "embedding_gather", "vocab and dim must be positive");
  if (count == 0) return;
  const unsigned grid = detail::grid_for(count * dim, kThreads);
  switch (type) {
    case TableType::Bf16:
      embedding_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint16_t*>(table), vocab, dim, ids, count,
                                                      scale, out);
      break;
    case TableType::F32:
      embedding_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(table), vocab, dim, ids, count, scale,
                                                      out);
      break;
  }
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out,
              cudaStream_t stream) {
  detail::require(rows >= 0 && dim >= 1 && eps >= 0, "rms_norm",
                  "rows " + std::to_string(rows) + " dim " + std::to_string(dim) + " (need rows >= 0, dim >= 1, eps >= 0)");
  detail::require(rows <= 0x7fffffff, "rms_norm", "more than 2^31 rows");
  if (rows == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, weight, dim, eps, out);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void apply_rope_neox(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                     const int64_t* positions, const float* cos_table, const float* sin_table, cudaStream_t stream) {
  detail::require(rotary_dim >= 2 && rotary_dim % 2 == 0 && rotary_dim <= head_dim, "apply_rope_neox",
                  "rotary_dim " + std::to_string(rotary_dim) + " must be even, >= 2 and <= head_dim " +
                      std::to_string(head_dim));
  const int64_t n = tokens * heads * (rotary_dim / 2);
  if (n <= 0) return;
  rope_neox_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(x, tokens, heads, head_dim, rotary_dim / 2,
                                                                         positions, cos_table, sin_table);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void silu_and_mul(const float* x, int64_t m, int64_t inter, float* out, cudaStream_t stream) {
  detail::require(m >= 0 && inter >= 0, "silu_and_mul", "negative size");
  if (m * inter == 0) return;
  silu_and_mul_kernel<<<detail::grid_for(m * inter, kThreads), kThreads, 0, stream>>>(x, m, inter, out);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void add_scaled(float* x, const float* delta, float alpha, int64_t n, cudaStream_t stream) {
  detail::require(n >= 0, "add_scaled", "negative size");
  if (n == 0) return;
  add_scaled_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(x, delta, alpha, n);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void copy_rows(const float* src, int64_t src_stride, const int64_t* src_rows, float* dst, int64_t dst_stride,
               const int64_t* dst_rows, int64_t rows, int64_t width, cudaStream_t stream) {
  detail::require(rows >= 0 && width >= 0 && src_stride >= width && dst_stride >= width, "copy_rows",
                  "strides must be at least the width " + std::to_string(width));
  if (rows * width == 0) return;
  copy_rows_kernel<<<detail::grid_for(rows * width, kThreads), kThreads, 0, stream>>>(src, src_stride, src_rows, dst,
                                                                                    dst_stride, dst_rows, rows, width);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void f32_to_bf16(const float* x, int64_t n, __nv_bfloat16* out, cudaStream_t stream) {
  detail::require(n >= 0, "f32_to_bf16", "negative size");
  if (n == 0) return;
  f32_to_bf16_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, out);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4serve::kernels::cuda
