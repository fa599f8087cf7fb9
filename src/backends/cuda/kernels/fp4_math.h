// SPDX-License-Identifier: Apache-2.0
// Scalar FP4/FP8 element math shared by the CUDA kernels and the host: E2M1 / E4M3 / E8M0 decode and encode and
// the NVFP4 activation fake-quant of one 16-element group. Everything is `__host__ __device__` under nvcc and
// plain inline under g++, so tests/backends/cuda/kernels/fp4_math_test.cpp checks the device code's exact arithmetic
// bit for bit against the CPU implementation (quant/formats.h, kernels::emulate_nvfp4_activations) on the host.
// Rounding is done with rintf (round to nearest even in the default mode, on host and device alike); scaling by
// powers of two is exact, so rintf is the only rounding step of every encoder.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "quant/block_format.h"

#ifdef __CUDACC__
#define FP4SERVE_HD __host__ __device__
#else
#define FP4SERVE_HD
#endif

namespace fp4serve::kernels::cuda {

/// Elements per block scale of format F, from its row (quant/block_format.h); a scalar constexpr, so device code
/// reads it directly.
template <quant::BlockFormat F>
inline constexpr int kGroupSize = static_cast<int>(quant::block_format_traits(F).group_size);

FP4SERVE_HD inline uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

FP4SERVE_HD inline float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/// Value of the low 4 bits of `code` as E2M1 (FORMATS.md §0.1). The 3 magnitude bits are copied into the
/// fp32 exponent/mantissa boundary, which gives value·2^-126 (code 1 = 0.5 becomes an fp32 subnormal), and
/// one exact multiply by 2^126 restores the value. The kernels use the same placement in bf16.
FP4SERVE_HD inline float e2m1_value(uint32_t code) {
  return bits_float(((code & 7u) << 22) | ((code & 8u) << 28)) * 0x1p126f;
}

/// Two E2M1 codes of a 32-bit word of 8 nibbles as a bf16x2 bit pattern: nibble r (r = 0..3) in the low half,
/// nibble r + 4 in the high half, each as value·2^-126 (the same placement as e2m1_value, in bf16: the 3
/// magnitude bits under the exponent, the sign bit on the sign). One shift and two masks; the GEMM kernel then
/// multiplies by 2^126 (exact) in bf16. The pairing of nibbles r and r + 4 is what gpu_layout.h is built around.
FP4SERVE_HD inline uint32_t e2m1_pair_raw_bf16(uint32_t word, int r) {
  const uint32_t v = word >> (4 * r);
  return ((v << 6) & 0x01C001C0u) | ((v << 12) & 0x80008000u);
}

/// Exact value of an E4M3 (e4m3fn) byte; 0x7F and 0xFF are NaN. Same placement trick: bits copied under the
/// fp32 exponent give value·2^-120 (E4M3 subnormals become fp32 subnormals), times 2^120.
FP4SERVE_HD inline float e4m3_value(uint32_t byte) {
  if ((byte & 0x7Fu) == 0x7Fu) return bits_float(0x7FC00000u | ((byte & 0x80u) << 24));
  return bits_float(((byte & 0x7Fu) << 20) | ((byte & 0x80u) << 24)) * 0x1p120f;
}

/// 2^(b − 127); b = 0 is the fp32 subnormal 2^-127, b = 255 gives +inf (FORMATS.md §0.2).
FP4SERVE_HD inline float e8m0_value(uint32_t byte) {
  return byte == 0 ? bits_float(0x00400000u) : bits_float((byte & 0xFFu) << 23);
}

/// Value of one block-scale byte of format F, decoded as its row's scale element says (E4M3 or E8M0).
template <quant::BlockFormat F>
FP4SERVE_HD inline float block_scale_value(uint32_t byte) {
  constexpr quant::ElementFormat kScale = quant::block_format_traits(F).scale;
  static_assert(kScale == quant::ElementFormat::E4M3 || kScale == quant::ElementFormat::E8M0, "one-byte scale decoders");
  if constexpr (kScale == quant::ElementFormat::E4M3) {
    return e4m3_value(byte);
  } else {
    return e8m0_value(byte);
  }
}

/// Nearest E2M1 code of x: |x| clamped to 6, round to nearest with ties to the even code, sign kept (−0 → 0x8),
/// NaN → 0x0. quant::float_to_e2m1 is the reference.
FP4SERVE_HD inline uint32_t e2m1_encode(float x) {
  if (x != x) return 0;
  const uint32_t sign = (float_bits(x) >> 28) & 8u;
  const float a = fminf(fabsf(x), 6.f);
  uint32_t code;
  if (a < 2.f) {
    code = static_cast<uint32_t>(rintf(a * 2.f));  // step 0.5: codes 0..4 are 0, .5, 1, 1.5, 2
  } else if (a < 4.f) {
    code = static_cast<uint32_t>(rintf(a)) + 2u;  // step 1: 2, 3, 4 → codes 4, 5, 6
  } else {
    code = static_cast<uint32_t>(rintf(a * 0.5f)) + 4u;  // step 2: 4, 6 → codes 6, 7
  }
  return sign | code;
}

/// Nearest E4M3 byte of x with saturation to ±448 (RNE); NaN → 0x7F with x's sign. quant::float_to_e4m3 is the
/// reference.
FP4SERVE_HD inline uint32_t e4m3_encode(float x) {
  const uint32_t sign = (float_bits(x) >> 24) & 0x80u;
  if (x != x) return sign | 0x7Fu;
  const float a = fminf(fabsf(x), 448.f);
  if (a < 0x1p-6f) return sign | static_cast<uint32_t>(rintf(a * 512.f));  // subnormals: step 2^-9, codes 0..8
  const int e = static_cast<int>((float_bits(a) >> 23) & 0xFFu) - 127;     // a = 1.f·2^e, e in [−6, 8]
  const float m = rintf(a * bits_float(static_cast<uint32_t>(127 + 3 - e) << 23));  // in [8, 16]
  // A mantissa carry (m = 16) lands exactly on the next exponent's first code.
  return sign | (static_cast<uint32_t>(e + 7) * 8u + static_cast<uint32_t>(m) - 8u);
}

/// NVFP4 activation block scale of one 16-element group (compressed-tensors `calculate_qparams`, the op order of
/// kernels::emulate_nvfp4_activations): E4M3(min(igs·(amax/6), 448)), a zero scale becomes 0.125.
FP4SERVE_HD inline float nvfp4_activation_scale(float amax, float input_global_scale) {
  const float s = e4m3_value(e4m3_encode(fminf(input_global_scale * (amax / 6.f), 448.f)));
  return s == 0.f ? 0.125f : s;
}

/// E2M1 code of one activation element given its group's step = scale / igs: clamp(x / step, ±6), RNE.
FP4SERVE_HD inline uint32_t nvfp4_activation_code(float x, float step) {
  return e2m1_encode(fmaxf(fminf(x / step, 6.f), -6.f));
}

/// The fake-quant of one group of 16 activations in place, bit for bit what kernels::emulate_nvfp4_activations
/// computes: x ← E2M1(x/step)·step with step = nvfp4_activation_scale(amax, igs) / igs.
FP4SERVE_HD inline void emulate_nvfp4_group(float* x, float input_global_scale) {
  constexpr int kGroup = kGroupSize<quant::BlockFormat::Nvfp4>;
  float amax = 0.f;
  for (int j = 0; j < kGroup; ++j) amax = fmaxf(amax, fabsf(x[j]));
  const float step = nvfp4_activation_scale(amax, input_global_scale) / input_global_scale;
  for (int j = 0; j < kGroup; ++j) x[j] = e2m1_value(nvfp4_activation_code(x[j], step)) * step;
}

/// E8M0 exponent of an MXFP4 activation group (compressed-tensors `generate_mx_scales` on fp32; the math of
/// kernels::mxfp4_activation_exponent, its reference): bits(amax) + 2^21 masked to sign and exponent, then
/// clamp(biased − 2, 0, 255); 0 for amax = 0 or NaN, 255 when the rounding reaches inf.
FP4SERVE_HD inline uint32_t mxfp4_activation_exponent(float amax) {
  if (amax != amax) return 0u;
  const uint32_t p2 = (float_bits(amax) + (1u << 21)) & 0xFF800000u;
  const uint32_t biased = (p2 >> 23) & 0xFFu;
  if (p2 == 0u) return 0u;
  if (biased == 0xFFu) return 255u;
  return biased <= 2u ? 0u : biased - 2u;
}

/// The MXFP4 fake-quant of one group of 32 activations in place, bit for bit kernels::emulate_mxfp4_activations:
/// s = 2^(e − 127) (e8m0_value), x ← E2M1(clamp(x / s, ±6))·s, a NaN quotient staying NaN.
FP4SERVE_HD inline void emulate_mxfp4_group(float* x) {
  constexpr int kGroup = kGroupSize<quant::BlockFormat::Mxfp4>;
  float amax = 0.f;
  bool nan = false;
  for (int j = 0; j < kGroup; ++j) {
    nan = nan || x[j] != x[j];
    amax = fmaxf(amax, fabsf(x[j]));
  }
  const float s = e8m0_value(nan ? 0u : mxfp4_activation_exponent(amax));
  for (int j = 0; j < kGroup; ++j) {
    const float q = x[j] / s;
    x[j] = q != q ? q : e2m1_value(e2m1_encode(fmaxf(fminf(q, 6.f), -6.f))) * s;
  }
}

}  // namespace fp4serve::kernels::cuda
