// SPDX-License-Identifier: Apache-2.0
// Scalar reference of the prepared-weight GEMM: element decode straight from the kernel layouts (the layout
// comment in prepared_linear.h), fp32 dot products, the same epilogue as the SIMD kernels.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/kernels/gemm_shared.h"
#include "backends/cpu/kernels/linear.h"
#include "fp4serve/error.h"
#include "quant/formats.h"

namespace fp4serve::kernels {

using prepare::kTileRows;
using prepare::PreparedLinear;
using prepare::WeightLayout;

namespace {

// The fp32 scales (and offsets) of Int4, Fp8 and Int8: [T][groups][8].
size_t group_index(const PreparedLinear& w, int64_t n, int64_t k) {
  return static_cast<size_t>(((n / kTileRows) * w.groups() + k / w.group_size) * kTileRows + n % kTileRows);
}

}  // namespace

float decode_weight(const PreparedLinear& w, int64_t n, int64_t k) {
  switch (w.layout) {
    case WeightLayout::Fp4:
      return quant::e2m1_to_float(prepare::prepared_nibble(w, n, k)) *
             quant::decode_block_scale(w.block_format, prepare::prepared_scale_byte(w, n, k / w.group_size));
    case WeightLayout::Int4: {
      const size_t g = group_index(w, n, k);
      return static_cast<float>(prepare::prepared_nibble(w, n, k)) * w.scales.as<float>()[g] + w.offsets.as<float>()[g];
    }
    case WeightLayout::Fp8: {
      const size_t at = static_cast<size_t>(((n / kTileRows) * w.in_features + k) * kTileRows + n % kTileRows);
      // Scales hold s·2^120 (repack_dense.cpp); undo the fold exactly.
      return quant::e4m3_to_float(w.codes.as<uint8_t>()[at]) *
             std::ldexp(w.scales.as<float>()[group_index(w, n, k)], -120);
    }
    case WeightLayout::Int8: {
      const size_t at = static_cast<size_t>(((n / kTileRows) * w.in_features + k) * kTileRows + n % kTileRows);
      return static_cast<float>(w.codes.as<int8_t>()[at]) * w.scales.as<float>()[group_index(w, n, k)];
    }
    case WeightLayout::Dense: {
      const size_t at = static_cast<size_t>(((n / kTileRows) * w.in_features + k) * kTileRows + n % kTileRows);
      return w.dense_storage == prepare::DenseStorage::Bf16 ? quant::bf16_to_float(w.codes.as<uint16_t>()[at])
                                                            : w.codes.as<float>()[at];
    }
  }
  return 0.f;
}

void dequantize(const PreparedLinear& w, float* out) {
  const int64_t k_total = w.in_features;
  for (int64_t n = 0; n < w.out_features; ++n) {
    for (int64_t j = 0; j < k_total; ++j) {
      const int64_t col = w.k_perm.empty() ? j : w.k_perm[static_cast<size_t>(j)];
      float v;
      if (w.layout == WeightLayout::Fp4 && !w.global_scale.empty()) {
        // The producers' op order (FORMATS.md §2.1, §3.2): scale ∘ global first, then times the code.
        const float s = quant::decode_block_scale(w.block_format, prepare::prepared_scale_byte(w, n, j / w.group_size));
        const float g = w.global_scale[static_cast<size_t>(n)];
        const float per_block = w.convention == prepare::GlobalScaleConvention::Divisor ? s / g : s * g;
        v = quant::e2m1_to_float(prepare::prepared_nibble(w, n, j)) * per_block;
      } else {
        v = decode_weight(w, n, j);
      }
      out[n * k_total + col] = v;
    }
  }
}

void reference_gemm(const PreparedLinear& w, const float* x, int64_t m, float* y) {
  const int64_t k_total = w.in_features;
  std::vector<float> row(static_cast<size_t>(k_total));
  for (int64_t n = 0; n < w.out_features; ++n) {
    for (int64_t k = 0; k < k_total; ++k) row[static_cast<size_t>(k)] = decode_weight(w, n, k);
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * k_total;
      float acc = 0.f;
      for (int64_t k = 0; k < k_total; ++k) acc += xi[k] * row[static_cast<size_t>(k)];
      y[i * w.out_features + n] = apply_epilogue(w, n, acc);
    }
  }
}

void linear_reference(const PreparedLinear& w, const float* x, int64_t m, float* y) {
  if (w.k_perm.empty()) return reference_gemm(w, x, m, y);
  const int64_t k_total = w.in_features;
  std::vector<float> xp(static_cast<size_t>(m * k_total));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k_total; ++j) xp[static_cast<size_t>(i * k_total + j)] = x[i * k_total + w.k_perm[static_cast<size_t>(j)]];
  }
  reference_gemm(w, xp.data(), m, y);
}

void emulate_nvfp4_activations(float* x, int64_t m, int64_t k, float igs) {
  constexpr int64_t kGroup = quant::block_format_traits(quant::BlockFormat::Nvfp4).group_size;
  if (k % kGroup != 0) {
    throw UsageError(fmt::format("NVFP4 W4A4 emulation needs K to be a multiple of {}, got {}", kGroup, k));
  }
  if (!std::isfinite(igs) || igs <= 0.f) {
    throw UsageError("W4A4 emulation needs a finite input_global_scale > 0, got " + std::to_string(igs));
  }
  for (int64_t i = 0; i < m * k; i += kGroup) {
    float amax = 0.f;
    for (int64_t j = 0; j < kGroup; ++j) amax = std::fmax(amax, std::fabs(x[i + j]));
    // compressed-tensors `calculate_qparams`: scale = E4M3(clamp(igs · (amax / 6), ±448)) in that operation order,
    // a zero scale becomes 0.125; dequantization multiplies by the same step s / igs that quantization divided by.
    float s = quant::e4m3_to_float(quant::float_to_e4m3(std::fmin(igs * (amax / 6.f), 448.f)));
    if (s == 0.f) s = 0.125f;
    const float step = s / igs;
    for (int64_t j = 0; j < kGroup; ++j) {
      const float q = quant::e2m1_to_float(quant::float_to_e2m1(std::fmax(std::fmin(x[i + j] / step, 6.f), -6.f)));
      x[i + j] = q * step;
    }
  }
}

uint8_t mxfp4_activation_exponent(float amax) {
  // A NaN amax reaches the reference's uint8 cast as NaN (its sign bit survives round_to_power_2's mask, log2 of
  // the resulting −inf is NaN, clamp keeps it), which torch turns into 0 on x86; the fixture pins this.
  if (std::isnan(amax)) return 0;
  uint32_t bits;
  std::memcpy(&bits, &amax, sizeof bits);
  // `round_to_power_2` in integer arithmetic on the fp32 pattern: + 2^(23 − 1 − 1), keep sign and exponent.
  const uint32_t p2 = (bits + (uint32_t{1} << 21)) & 0xFF800000u;
  const uint32_t biased = (p2 >> 23) & 0xFFu;
  if (p2 == 0) return 0;            // log2(0) = −inf, clamped to 0
  if (biased == 0xFFu) return 255;  // inf (also NaN → inf): clamped to 255
  // 127 + (biased − 127) − floor(log2 6) = biased − 2, clamped at 0.
  return biased <= 2 ? uint8_t{0} : static_cast<uint8_t>(biased - 2);
}

void emulate_mxfp4_activations(float* x, int64_t m, int64_t k) {
  constexpr int64_t kGroup = quant::block_format_traits(quant::BlockFormat::Mxfp4).group_size;
  if (k % kGroup != 0) {
    throw UsageError(fmt::format("MXFP4 W4A4 emulation needs K to be a multiple of {}, got {}", kGroup, k));
  }
  for (int64_t i = 0; i < m * k; i += kGroup) {
    float amax = 0.f;
    bool nan = false;
    for (int64_t j = 0; j < kGroup; ++j) {
      nan = nan || std::isnan(x[i + j]);
      amax = std::fmax(amax, std::fabs(x[i + j]));
    }
    if (nan) amax = std::numeric_limits<float>::quiet_NaN();  // torch.amax propagates NaN (exponent 0, see above)
    const float s = quant::e8m0_to_float(mxfp4_activation_exponent(amax));
    for (int64_t j = 0; j < kGroup; ++j) {
      const float q = x[i + j] / s;
      // torch.clamp and cast_to_fp4 keep a NaN quotient NaN (inf / inf, or any value over an inf scale times 0).
      x[i + j] = std::isnan(q) ? q : quant::e2m1_to_float(quant::float_to_e2m1(std::fmax(std::fmin(q, 6.f), -6.f))) * s;
    }
  }
}

}  // namespace fp4serve::kernels
