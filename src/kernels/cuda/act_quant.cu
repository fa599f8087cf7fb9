// SPDX-License-Identifier: Apache-2.0
// Small element-wise kernels of the CUDA linear path: the W4A4 activation quantizers (one thread per 16-element
// NVFP4 or 32-element MXFP4 group, the scalar math of fp4_math.h shared with the host test) and the bias
// broadcast that feeds cuBLAS.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp4_math.h"
#include "kernels/cuda/gemm_fp4_launch.h"

namespace fp4serve::kernels::cuda {
namespace {

__global__ void quantize_nvfp4_kernel(const __nv_bfloat16* x, int64_t groups, float igs, __nv_bfloat16* out) {
  const int64_t grp = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (grp >= groups) return;
  const uint4* src = reinterpret_cast<const uint4*>(x + grp * 16);
  uint4 raw[2] = {src[0], src[1]};
  __nv_bfloat16* v = reinterpret_cast<__nv_bfloat16*>(raw);
  float amax = 0.f;
  for (int j = 0; j < 16; ++j) amax = fmaxf(amax, fabsf(__bfloat162float(v[j])));
  const float s = nvfp4_activation_scale(amax, igs);
  const float step = s / igs;
  // code·s is exact in bf16 (2-bit × 4-bit significands); the 1/igs goes to the GEMM epilogue.
  for (int j = 0; j < 16; ++j) {
    v[j] = __float2bfloat16_rn(e2m1_value(nvfp4_activation_code(__bfloat162float(v[j]), step)) * s);
  }
  uint4* dst = reinterpret_cast<uint4*>(out + grp * 16);
  dst[0] = raw[0];
  dst[1] = raw[1];
}

__global__ void quantize_nvfp4_packed_kernel(const __nv_bfloat16* x, int64_t m, int64_t k, float igs, uint8_t* codes,
                                             uint8_t* scales) {
  const int64_t grp = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups_per_row = k / 16;
  if (grp >= m * groups_per_row) return;
  const int64_t row = grp / groups_per_row, col = grp % groups_per_row;
  const uint4* src = reinterpret_cast<const uint4*>(x + grp * 16);
  uint4 raw[2] = {src[0], src[1]};
  const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(raw);
  float amax = 0.f;
  for (int j = 0; j < 16; ++j) amax = fmaxf(amax, fabsf(__bfloat162float(v[j])));
  const float s = nvfp4_activation_scale(amax, igs);
  const float step = s / igs;
  uint32_t packed[2] = {0u, 0u};
  for (int j = 0; j < 16; ++j) packed[j / 8] |= nvfp4_activation_code(__bfloat162float(v[j]), step) << (4 * (j % 8));
  *reinterpret_cast<uint2*>(codes + grp * 8) = make_uint2(packed[0], packed[1]);
  // The scale actually used (0.125 for an all-zero group) re-encodes exactly.
  const int64_t col_blocks = (groups_per_row + 3) / 4;
  const int64_t at = ((row / 128) * col_blocks + col / 4) * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + col % 4;
  scales[at] = static_cast<uint8_t>(e4m3_encode(s));
}

// One thread per 32-element MXFP4 group: the scalar math of fp4_math.h (emulate_mxfp4_group) on bf16 inputs.
__device__ inline uint32_t mxfp4_group_exponent(const __nv_bfloat16* v) {
  float amax = 0.f;
  bool nan = false;
  for (int j = 0; j < 32; ++j) {
    const float f = __bfloat162float(v[j]);
    nan = nan || f != f;
    amax = fmaxf(amax, fabsf(f));
  }
  return nan ? 0u : mxfp4_activation_exponent(amax);
}

__global__ void quantize_mxfp4_kernel(const __nv_bfloat16* x, int64_t groups, __nv_bfloat16* out) {
  const int64_t grp = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (grp >= groups) return;
  const uint4* src = reinterpret_cast<const uint4*>(x + grp * 32);
  uint4 raw[4] = {src[0], src[1], src[2], src[3]};
  __nv_bfloat16* v = reinterpret_cast<__nv_bfloat16*>(raw);
  const float s = e8m0_value(mxfp4_group_exponent(v));
  for (int j = 0; j < 32; ++j) {
    const float q = __bfloat162float(v[j]) / s;
    v[j] = __float2bfloat16_rn(q != q ? q : e2m1_value(e2m1_encode(fmaxf(fminf(q, 6.f), -6.f))) * s);
  }
  uint4* dst = reinterpret_cast<uint4*>(out + grp * 32);
  for (int i = 0; i < 4; ++i) dst[i] = raw[i];
}

__global__ void quantize_mxfp4_packed_kernel(const __nv_bfloat16* x, int64_t m, int64_t k, uint8_t* codes,
                                             uint8_t* scales) {
  const int64_t grp = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups_per_row = k / 32;
  if (grp >= m * groups_per_row) return;
  const int64_t row = grp / groups_per_row, col = grp % groups_per_row;
  const uint4* src = reinterpret_cast<const uint4*>(x + grp * 32);
  uint4 raw[4] = {src[0], src[1], src[2], src[3]};
  const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(raw);
  const uint32_t e = mxfp4_group_exponent(v);
  const float s = e8m0_value(e);
  uint32_t packed[4] = {0u, 0u, 0u, 0u};
  for (int j = 0; j < 32; ++j) {
    packed[j / 8] |= e2m1_encode(fmaxf(fminf(__bfloat162float(v[j]) / s, 6.f), -6.f)) << (4 * (j % 8));
  }
  *reinterpret_cast<uint4*>(codes + grp * 16) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  const int64_t col_blocks = (groups_per_row + 3) / 4;
  const int64_t at = ((row / 128) * col_blocks + col / 4) * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + col % 4;
  scales[at] = static_cast<uint8_t>(e);
}

__global__ void w4a4_epilogue_kernel(const float* d, int64_t m, int64_t n, float activation_divisor,
                                     const float* global_scale, bool divisor, const float* bias, float* y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m * n) return;
  const int64_t col = i % n;
  float v = d[i] / activation_divisor;
  if (global_scale != nullptr) v = divisor ? v / global_scale[col] : v * global_scale[col];
  if (bias != nullptr) v += bias[col];
  y[i] = v;
}

__global__ void broadcast_bias_kernel(const float* bias, int64_t m, int64_t n, float* y_f32, __nv_bfloat16* y_bf16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m * n) return;
  const float b = bias[i % n];
  if (y_f32 != nullptr) {
    y_f32[i] = b;
  } else {
    y_bf16[i] = __float2bfloat16_rn(b);
  }
}

}  // namespace

void launch_quantize_nvfp4(const __nv_bfloat16* x, int64_t m, int64_t k, float input_global_scale,
                           __nv_bfloat16* out, cudaStream_t stream) {
  const int64_t groups = m * k / 16;
  if (groups == 0) return;
  quantize_nvfp4_kernel<<<static_cast<unsigned>((groups + 255) / 256), 256, 0, stream>>>(x, groups,
                                                                                         input_global_scale, out);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void launch_quantize_nvfp4_packed(const __nv_bfloat16* x, int64_t m, int64_t k, float input_global_scale,
                                  uint8_t* codes, uint8_t* scales, cudaStream_t stream) {
  const int64_t groups = m * k / 16;
  if (groups == 0) return;
  quantize_nvfp4_packed_kernel<<<static_cast<unsigned>((groups + 255) / 256), 256, 0, stream>>>(
      x, m, k, input_global_scale, codes, scales);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void launch_quantize_mxfp4(const __nv_bfloat16* x, int64_t m, int64_t k, __nv_bfloat16* out, cudaStream_t stream) {
  const int64_t groups = m * k / 32;
  if (groups == 0) return;
  quantize_mxfp4_kernel<<<static_cast<unsigned>((groups + 255) / 256), 256, 0, stream>>>(x, groups, out);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void launch_quantize_mxfp4_packed(const __nv_bfloat16* x, int64_t m, int64_t k, uint8_t* codes, uint8_t* scales,
                                  cudaStream_t stream) {
  const int64_t groups = m * k / 32;
  if (groups == 0) return;
  quantize_mxfp4_packed_kernel<<<static_cast<unsigned>((groups + 255) / 256), 256, 0, stream>>>(x, m, k, codes,
                                                                                                scales);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void launch_w4a4_epilogue(const float* d, int64_t m, int64_t n, float activation_divisor, const float* global_scale,
                          bool divisor, const float* bias, float* y, cudaStream_t stream) {
  if (m * n == 0) return;
  w4a4_epilogue_kernel<<<static_cast<unsigned>((m * n + 255) / 256), 256, 0, stream>>>(
      d, m, n, activation_divisor, global_scale, divisor, bias, y);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

void launch_broadcast_bias(const float* bias, int64_t m, int64_t n, float* y_f32, __nv_bfloat16* y_bf16,
                           cudaStream_t stream) {
  if (m * n == 0) return;
  broadcast_bias_kernel<<<static_cast<unsigned>((m * n + 255) / 256), 256, 0, stream>>>(bias, m, n, y_f32, y_bf16);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4serve::kernels::cuda
