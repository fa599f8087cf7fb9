// SPDX-License-Identifier: Apache-2.0
// Small element-wise kernels of the CUDA linear path: the W4A4 activation quantizer (one thread per 16-element
// NVFP4 group, the scalar math of fp4_math.h shared with the host test) and the bias broadcast that feeds cuBLAS.
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

void launch_broadcast_bias(const float* bias, int64_t m, int64_t n, float* y_f32, __nv_bfloat16* y_bf16,
                           cudaStream_t stream) {
  if (m * n == 0) return;
  broadcast_bias_kernel<<<static_cast<unsigned>((m * n + 255) / 256), 256, 0, stream>>>(bias, m, n, y_f32, y_bf16);
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4serve::kernels::cuda
