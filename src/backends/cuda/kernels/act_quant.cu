// SPDX-License-Identifier: Apache-2.0
// Small element-wise kernels of the CUDA linear path: the W4A4 activation quantizers (one thread per group of
// the weights' block format: 16 elements for NVFP4, 32 for MXFP4, from its row in quant/block_format.h; the scalar
// math of fp4_math.h shared with the host test, chosen by the row's scale element) and the bias broadcast that
// feeds cuBLAS.
#include <cuda_bf16.h>

#include <cstdint>

#include "backends/cuda/kernels/cuda_check.h"
#include "backends/cuda/kernels/fp4_math.h"
#include "backends/cuda/kernels/gemm_fp4_launch.h"
#include "backends/cuda/kernels/native_fp4.h"
#include "quant/block_format.h"

namespace fp4serve::kernels::cuda {
namespace {

using quant::BlockFormat;
using quant::ElementFormat;

template <BlockFormat F>
inline constexpr ElementFormat kScaleOf = quant::block_format_traits(F).scale;
// 16-byte vectors of bf16 per group, and the packed E2M1 codes of one group as one aligned store.
template <BlockFormat F>
inline constexpr int kVectors = kGroupSize<F> * static_cast<int>(sizeof(__nv_bfloat16)) / static_cast<int>(sizeof(uint4));
template <int kWords>
struct alignas(4 * kWords) CodeWords {
  uint32_t w[kWords];
};
template <BlockFormat F>
using GroupCodes = CodeWords<kGroupSize<F> / 8>;

// E4M3 block scales with a global scale (NVFP4): s = E4M3(igs·amax/6) per group.
template <BlockFormat F>
__global__ void quantize_e4m3_kernel(const __nv_bfloat16* x, int64_t groups, float igs, __nv_bfloat16* out) {
  constexpr int kGroup = kGroupSize<F>;
  const int64_t grp = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (grp >= groups) return;
  const uint4* src = reinterpret_cast<const uint4*>(x + grp * kGroup);
  uint4 raw[kVectors<F>];
#pragma unroll
  for (int i = 0; i < kVectors<F>; ++i) raw[i] = src[i];
  __nv_bfloat16* v = reinterpret_cast<__nv_bfloat16*>(raw);
  float amax = 0.f;
  for (int j = 0; j < kGroup; ++j) amax = fmaxf(amax, fabsf(__bfloat162float(v[j])));
  const float s = nvfp4_activation_scale(amax, igs);
  const float step = s / igs;
  // code·s is exact in bf16 (2-bit × 4-bit significands); the 1/igs goes to the GEMM epilogue.
  for (int j = 0; j < kGroup; ++j) {
    v[j] = __float2bfloat16_rn(e2m1_value(nvfp4_activation_code(__bfloat162float(v[j]), step)) * s);
  }
  uint4* dst = reinterpret_cast<uint4*>(out + grp * kGroup);
#pragma unroll
  for (int i = 0; i < kVectors<F>; ++i) dst[i] = raw[i];
}

template <BlockFormat F>
__global__ void quantize_e4m3_packed_kernel(const __nv_bfloat16* x, int64_t m, int64_t k, float igs, uint8_t* codes,
                                            uint8_t* scales) {
  constexpr int kGroup = kGroupSize<F>;
  const int64_t grp = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups_per_row = k / kGroup;
  if (grp >= m * groups_per_row) return;
  const int64_t row = grp / groups_per_row, col = grp % groups_per_row;
  const uint4* src = reinterpret_cast<const uint4*>(x + grp * kGroup);
  uint4 raw[kVectors<F>];
#pragma unroll
  for (int i = 0; i < kVectors<F>; ++i) raw[i] = src[i];
  const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(raw);
  float amax = 0.f;
  for (int j = 0; j < kGroup; ++j) amax = fmaxf(amax, fabsf(__bfloat162float(v[j])));
  const float s = nvfp4_activation_scale(amax, igs);
  const float step = s / igs;
  GroupCodes<F> packed{};
  for (int j = 0; j < kGroup; ++j) packed.w[j / 8] |= nvfp4_activation_code(__bfloat162float(v[j]), step) << (4 * (j % 8));
  *reinterpret_cast<GroupCodes<F>*>(codes + grp * (kGroup / 2)) = packed;
  // The scale actually used (0.125 for an all-zero group) re-encodes exactly.
  scales[block_scale_offset(row, col, groups_per_row)] = static_cast<uint8_t>(e4m3_encode(s));
}

// E8M0 block scales without a global scale (MXFP4): the scalar math of fp4_math.h (emulate_mxfp4_group) on bf16.
template <BlockFormat F>
__device__ inline uint32_t e8m0_group_exponent(const __nv_bfloat16* v) {
  float amax = 0.f;
  bool nan = false;
  for (int j = 0; j < kGroupSize<F>; ++j) {
    const float f = __bfloat162float(v[j]);
    nan = nan || f != f;
    amax = fmaxf(amax, fabsf(f));
  }
  return nan ? 0u : mxfp4_activation_exponent(amax);
}

template <BlockFormat F>
__global__ void quantize_e8m0_kernel(const __nv_bfloat16* x, int64_t groups, __nv_bfloat16* out) {
  constexpr int kGroup = kGroupSize<F>;
  const int64_t grp = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (grp >= groups) return;
  const uint4* src = reinterpret_cast<const uint4*>(x + grp * kGroup);
  uint4 raw[kVectors<F>];
#pragma unroll
  for (int i = 0; i < kVectors<F>; ++i) raw[i] = src[i];
  __nv_bfloat16* v = reinterpret_cast<__nv_bfloat16*>(raw);
  const float s = e8m0_value(e8m0_group_exponent<F>(v));
  for (int j = 0; j < kGroup; ++j) {
    const float q = __bfloat162float(v[j]) / s;
    v[j] = __float2bfloat16_rn(q != q ? q : e2m1_value(e2m1_encode(fmaxf(fminf(q, 6.f), -6.f))) * s);
  }
  uint4* dst = reinterpret_cast<uint4*>(out + grp * kGroup);
  for (int i = 0; i < kVectors<F>; ++i) dst[i] = raw[i];
}

template <BlockFormat F>
__global__ void quantize_e8m0_packed_kernel(const __nv_bfloat16* x, int64_t m, int64_t k, uint8_t* codes,
                                            uint8_t* scales) {
  constexpr int kGroup = kGroupSize<F>;
  const int64_t grp = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups_per_row = k / kGroup;
  if (grp >= m * groups_per_row) return;
  const int64_t row = grp / groups_per_row, col = grp % groups_per_row;
  const uint4* src = reinterpret_cast<const uint4*>(x + grp * kGroup);
  uint4 raw[kVectors<F>];
#pragma unroll
  for (int i = 0; i < kVectors<F>; ++i) raw[i] = src[i];
  const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(raw);
  const uint32_t e = e8m0_group_exponent<F>(v);
  const float s = e8m0_value(e);
  GroupCodes<F> packed{};
  for (int j = 0; j < kGroup; ++j) {
    packed.w[j / 8] |= e2m1_encode(fmaxf(fminf(__bfloat162float(v[j]) / s, 6.f), -6.f)) << (4 * (j % 8));
  }
  *reinterpret_cast<GroupCodes<F>*>(codes + grp * (kGroup / 2)) = packed;
  scales[block_scale_offset(row, col, groups_per_row)] = static_cast<uint8_t>(e);
}

// The quantizers of format F, chosen by its scale element (E4M3 needs the format's global scale: igs).
template <BlockFormat F>
void launch_quantize_activations_of(const __nv_bfloat16* x, int64_t m, int64_t k, float input_global_scale,
                                    __nv_bfloat16* out, cudaStream_t stream) {
  static_assert(kScaleOf<F> == ElementFormat::E8M0 ||
                    (kScaleOf<F> == ElementFormat::E4M3 && quant::block_format_traits(F).global_scale),
                "W4A4 activation quantizers: E4M3 scales under a global scale, or E8M0 scales");
  const int64_t groups = m * k / kGroupSize<F>;
  if (groups == 0) return;
  const auto blocks = static_cast<unsigned>((groups + 255) / 256);
  if constexpr (kScaleOf<F> == ElementFormat::E4M3) {
    quantize_e4m3_kernel<F><<<blocks, 256, 0, stream>>>(x, groups, input_global_scale, out);
  } else {
    quantize_e8m0_kernel<F><<<blocks, 256, 0, stream>>>(x, groups, out);
  }
  FP4SERVE_CUDA_CHECK_LAUNCH();
}

template <BlockFormat F>
void launch_quantize_activations_packed_of(const __nv_bfloat16* x, int64_t m, int64_t k, float input_global_scale,
                                           uint8_t* codes, uint8_t* scales, cudaStream_t stream) {
  const int64_t groups = m * k / kGroupSize<F>;
  if (groups == 0) return;
  const auto blocks = static_cast<unsigned>((groups + 255) / 256);
  if constexpr (kScaleOf<F> == ElementFormat::E4M3) {
    quantize_e4m3_packed_kernel<F><<<blocks, 256, 0, stream>>>(x, m, k, input_global_scale, codes, scales);
  } else {
    quantize_e8m0_packed_kernel<F><<<blocks, 256, 0, stream>>>(x, m, k, codes, scales);
  }
  FP4SERVE_CUDA_CHECK_LAUNCH();
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

void launch_quantize_activations(quant::BlockFormat format, const __nv_bfloat16* x, int64_t m, int64_t k,
                                 float input_global_scale, __nv_bfloat16* out, cudaStream_t stream) {
  quant::visit_block_format(format, [&]<BlockFormat F>() {
    launch_quantize_activations_of<F>(x, m, k, input_global_scale, out, stream);
  });
}

void launch_quantize_activations_packed(quant::BlockFormat format, const __nv_bfloat16* x, int64_t m, int64_t k,
                                        float input_global_scale, uint8_t* codes, uint8_t* scales,
                                        cudaStream_t stream) {
  quant::visit_block_format(format, [&]<BlockFormat F>() {
    launch_quantize_activations_packed_of<F>(x, m, k, input_global_scale, codes, scales, stream);
  });
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
