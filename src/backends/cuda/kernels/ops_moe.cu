// SPDX-License-Identifier: Apache-2.0
// The ops of ops_moe.h. Each mirrors its CPU kernel formula for formula (fp32, expf); reductions (the dense
// rotation's dot products) differ from the CPU only in summation order.
#include <cmath>
#include <string>

#include "backends/cuda/kernels/cuda_check.h"
#include "backends/cuda/kernels/ops_launch.h"
#include "backends/cuda/kernels/ops_moe.h"

namespace fp4serve::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlock = 4096;  // one slice in shared memory (16 KiB)

__global__ void scatter_add_kernel(const float* y, int64_t width, const int64_t* rows, const float* weights, int64_t n,
                                   float* out) {
  const int64_t total = n * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width;
    const int64_t c = i % width;
    out[rows[r] * width + c] += y[i] * weights[r];
  }
}

__global__ void swiglu_oai_kernel(const float* x, int64_t m, int64_t inter, float alpha, float limit, float* out) {
  const int64_t total = m * inter;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter;
    const int64_t c = i % inter;
    const float g = fminf(x[r * 2 * inter + c], limit);
    const float u = fminf(fmaxf(x[r * 2 * inter + inter + c], -limit), limit);
    const float glu = g / (1.0f + expf(-alpha * g));
    out[i] = (u + 1.0f) * glu;
  }
}

__global__ void sigmoid_gated_kernel(const float* y, const float* gate, int64_t m, int64_t width, float* out) {
  const int64_t total = m * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = 1.0f / (1.0f + expf(-gate[i / width]));
    out[i] += g * y[i];
  }
}

__global__ void fill_kernel(float* x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = value;
  }
}

// blockIdx.x = row · slices + slice. Butterflies in shared memory, log2(block) stages, then the 1/√b scale.
__global__ void fwht_kernel(float* x, int64_t slices, int64_t stride, int block, float scale) {
  extern __shared__ float buf[];
  const int64_t row = blockIdx.x / slices;
  float* v = x + row * stride + (blockIdx.x % slices) * block;
  for (int i = threadIdx.x; i < block; i += blockDim.x) buf[i] = v[i];
  __syncthreads();
  for (int h = 1; h < block; h *= 2) {
    for (int p = threadIdx.x; p < block / 2; p += blockDim.x) {
      const int i = (p / h) * 2 * h + p % h;
      const float a = buf[i];
      const float b = buf[i + h];
      buf[i] = a + b;
      buf[i + h] = a - b;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < block; i += blockDim.x) v[i] = buf[i] * scale;
}

__global__ void rotate_kernel(float* x, int64_t slices, int64_t stride, const float* matrix, int block) {
  extern __shared__ float buf[];
  const int64_t row = blockIdx.x / slices;
  float* v = x + row * stride + (blockIdx.x % slices) * block;
  for (int i = threadIdx.x; i < block; i += blockDim.x) buf[i] = v[i];
  __syncthreads();
  for (int j = threadIdx.x; j < block; j += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < block; ++i) acc += buf[i] * matrix[static_cast<int64_t>(i) * block + j];
    v[j] = acc;
  }
}

void check_slices(const char* op, int64_t rows, int64_t width, int64_t stride, int64_t block, bool pow2) {
  const bool block_ok = block >= (pow2 ? 2 : 1) && block <= kMaxBlock && (!pow2 || (block & (block - 1)) == 0);
  detail::require(block_ok && rows >= 0 && width >= 1 && width % block == 0 && width <= stride, op,
                  "block " + std::to_string(block) + (pow2 ? " (a power of two in [2, 4096])" : " (in [1, 4096])") +
                      " must divide width " + std::to_string(width) + " <= stride " + std::to_string(stride) +
                      ", rows " + std::to_string(rows) + " >= 0");
}

}  // namespace

void scatter_add_rows(const float* y, int64_t width, const int64_t* rows, const float* weights, int64_t n, float* out,
                      cudaStream_t stream) {
  detail::require(n >= 0 && width >= 0, "scatter_add_rows", "negative size");
  if (n * width == 0) return;
  scatter_add_kernel<<<detail::grid_for(n * width, kThreads), kThreads, 0, stream>>>(y, width, rows, weights, n, out);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void swiglu_oai_and_mul(const float* x, int64_t m, int64_t inter, float alpha, float limit, float* out,
                        cudaStream_t stream) {
  detail::require(m >= 0 && inter >= 0, "swiglu_oai_and_mul", "negative size");
  detail::require(limit > 0, "swiglu_oai_and_mul", "limit must be > 0, found " + std::to_string(limit));
  if (m * inter == 0) return;
  swiglu_oai_kernel<<<detail::grid_for(m * inter, kThreads), kThreads, 0, stream>>>(x, m, inter, alpha, limit, out);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void add_sigmoid_gated(const float* y, const float* gate, int64_t m, int64_t width, float* out, cudaStream_t stream) {
  detail::require(m >= 0 && width >= 0, "add_sigmoid_gated", "negative size");
  if (m * width == 0) return;
  sigmoid_gated_kernel<<<detail::grid_for(m * width, kThreads), kThreads, 0, stream>>>(y, gate, m, width, out);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void fill(float* x, int64_t n, float value, cudaStream_t stream) {
  detail::require(n >= 0, "fill", "negative size");
  if (n == 0) return;
  fill_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, value);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void fwht_blocks(float* x, int64_t rows, int64_t width, int64_t stride, int64_t block, cudaStream_t stream) {
  check_slices("fwht_blocks", rows, width, stride, block, true);
  const int64_t grid = rows * (width / block);
  detail::require(grid <= 0x7fffffff, "fwht_blocks", "more than 2^31 slices");
  if (grid == 0) return;
  const auto b = static_cast<int>(block);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  fwht_kernel<<<static_cast<unsigned>(grid), kThreads, static_cast<size_t>(b) * sizeof(float), stream>>>(
      x, width / block, stride, b, scale);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void rotate_blocks(float* x, int64_t rows, int64_t width, int64_t stride, const float* matrix, int64_t block,
                   cudaStream_t stream) {
  check_slices("rotate_blocks", rows, width, stride, block, false);
  const int64_t grid = rows * (width / block);
  detail::require(grid <= 0x7fffffff, "rotate_blocks", "more than 2^31 slices");
  if (grid == 0) return;
  const auto b = static_cast<int>(block);
  rotate_kernel<<<static_cast<unsigned>(grid), kThreads, static_cast<size_t>(b) * sizeof(float), stream>>>(
      x, width / block, stride, matrix, b);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4serve::kernels::cuda
