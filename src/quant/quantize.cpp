// SPDX-License-Identifier: Apache-2.0
#include "quant/quantize.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "fp4serve/error.h"
#include "quant/formats.h"
#include "quant/packing.h"

namespace fp4serve::quant {
namespace {

using core::DType;

// The largest FP4 magnitude and E4M3 magnitude: 6 · 448 = 2688 is CT's `scale_data.max * quant_data.max`.
constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Max = 448.0f;
// CT `_get_dtype_eps(float8_e4m3fn)`: the replacement for an all-zero group's scale.
constexpr float kZeroNvfp4Scale = 0.125f;

bool is_source_dtype(DType d) { return d == DType::BF16 || d == DType::F16 || d == DType::F32; }

void check_source(DType source, std::string_view what) {
  if (!is_source_dtype(source)) {
    throw UsageError(fmt::format("{}: source dtype {} is not BF16, F16 or F32", what, core::dtype_name(source)));
  }
}

// One fp32 result rounded to the source dtype: what torch's CPU kernels do for a BF16/F16 tensor operation.
float in_source(float v, DType source) {
  if (source == DType::BF16) return bf16_to_float(float_to_bf16(v));
  if (source == DType::F16) return f16_to_float(float_to_f16(v));
  return v;
}

// torch.finfo(dtype).eps: the replacement CT writes for an all-zero int group's scale.
float source_eps(DType source) {
  if (source == DType::BF16) return 0x1p-7f;
  if (source == DType::F16) return 0x1p-10f;
  return std::numeric_limits<float>::epsilon();
}

// torch.finfo(dtype).tiny: CT clamps amax to it before dividing.
float source_tiny(DType source) {
  if (source == DType::F16) return 0x1p-14f;
  return std::numeric_limits<float>::min();  // BF16 shares the F32 exponent range
}

void check_shape(std::span<const float> w, int64_t rows, int64_t cols, int64_t group, std::string_view what) {
  if (rows <= 0 || cols <= 0) throw UsageError(fmt::format("{}: shape [{}, {}] is empty", what, rows, cols));
  if (group <= 0) throw UsageError(fmt::format("{}: group size {} is not positive", what, group));
  if (cols % group != 0) {
    throw UsageError(fmt::format("{}: in_features {} is not a multiple of the group size {}", what, cols, group));
  }
  if (static_cast<int64_t>(w.size()) != rows * cols) {
    throw UsageError(fmt::format("{}: {} values for shape [{}, {}]", what, w.size(), rows, cols));
  }
}

// E2M1 code of an already scaled value as CT's `cast_to_fp4` + `pack_fp4_to_uint8` produce it: the magnitude
// rounds to nearest even after clamping to ±6, and the sign comes from torch.sign(v)·|rounded|, so a nonzero
// negative value that rounds to 0 keeps its sign bit (0x8) while v = ±0 gives +0 (0x0).
uint8_t fp4_code(float v) { return v == 0.0f ? uint8_t{0} : float_to_e2m1(std::clamp(v, -kE2M1Max, kE2M1Max)); }

float group_abs_max(const float* g, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(g[i]));
  return m;
}

}  // namespace

float abs_max(std::span<const float> values, std::string_view name) {
  float m = 0.0f;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      throw UsageError(fmt::format("{}: element {} is {}; cannot quantize a non-finite weight", name, i, values[i]));
    }
    m = std::max(m, std::fabs(values[i]));
  }
  return m;
}

float nvfp4_global_scale(float amax, DType source) {
  check_source(source, "nvfp4_global_scale");
  if (!(amax >= 0.0f)) throw UsageError(fmt::format("nvfp4_global_scale: amax {} is negative or NaN", amax));
  // CT generate_gparam: clamp(amax, min=tiny), then `448 * 6 / amax` in the observed dtype, nan/inf → 1, to F32.
  // A Python number divided by a tensor is torch's __rtruediv__, which computes reciprocal(amax) · 2688: two
  // roundings to the observed dtype, not one division (for BF16 the results differ by one ulp in 2 of the 14
  // layers of tests/data/ref/llama-bf16). F16 is computed in F32 (see the header: the producer's F16
  // arithmetic overflows for ordinary weights).
  const DType compute = source == DType::F16 ? DType::F32 : source;
  const float clamped = std::max(amax, source_tiny(compute));
  const float reciprocal = in_source(1.0f / clamped, compute);
  const float gs = in_source(reciprocal * (kE4M3Max * kE2M1Max), compute);
  return std::isfinite(gs) ? gs : 1.0f;
}

QuantizedNvfp4 quantize_nvfp4(std::span<const float> w, int64_t rows, int64_t cols, float global_scale,
                              DType source) {
  check_source(source, "quantize_nvfp4");
  check_shape(w, rows, cols, kNvfp4GroupSize, "quantize_nvfp4");
  if (!(std::isfinite(global_scale) && global_scale > 0.0f)) {
    throw UsageError(fmt::format("quantize_nvfp4: global scale {} is not finite and positive", global_scale));
  }
  QuantizedNvfp4 out;
  out.rows = rows;
  out.cols = cols;
  out.global_scale = global_scale;
  const int64_t groups = cols / kNvfp4GroupSize;
  out.scales.resize(static_cast<size_t>(rows * groups));
  out.packed.assign(static_cast<size_t>(rows * cols / 2), 0);
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = w.data() + n * cols + g * kNvfp4GroupSize;
      // CT calculate_qparams: amax / (bit_range / 2) in the observed dtype, times the F32 global scale, then
      // clamp to the E4M3 range and cast (RNE); zero scales become eps(E4M3) = 0.125.
      const float local = in_source(group_abs_max(x, kNvfp4GroupSize) / kE2M1Max, source);
      const uint8_t code = float_to_e4m3(std::clamp(global_scale * local, -kE4M3Max, kE4M3Max));
      const uint8_t stored = e4m3_to_float(code) == 0.0f ? float_to_e4m3(kZeroNvfp4Scale) : code;
      out.scales[static_cast<size_t>(n * groups + g)] = stored;
      // CT _quantize: scale / global_scale, then x / that, both in F32 (the scale tensor promotes the weight).
      const float divisor = e4m3_to_float(stored) / global_scale;
      for (int64_t i = 0; i < kNvfp4GroupSize; ++i) {
        const uint8_t c = fp4_code(x[i] / divisor);
        const size_t k = static_cast<size_t>(n * cols + g * kNvfp4GroupSize + i);
        out.packed[k / 2] |= static_cast<uint8_t>(k % 2 == 0 ? c : c << 4);
      }
    }
  }
  return out;
}

uint8_t mxfp4_scale_code(float amax, DType source) {
  check_source(source, "mxfp4_scale_code");
  // CT round_to_power_2 on the observed dtype's bits: add half of the first mantissa bit below E2M1's one
  // mantissa bit (1 << (mantissa_bits − 2)), then keep sign and exponent. Adding to a subnormal can carry into
  // the exponent field; otherwise a subnormal keeps exponent field 0, i.e. value 0.
  int exponent_field = 0;
  int bias = 127;
  if (source == DType::F16) {
    const uint32_t bits = float_to_f16(amax);  // exact: amax is an F16 value
    exponent_field = static_cast<int>(((bits + (1u << 8)) >> 10) & 0x1Fu);
    bias = 15;
    if (exponent_field == 0x1F) return 255;  // rounded up to inf: log2 → inf, clamped to 255
  } else {
    const uint32_t bits = std::bit_cast<uint32_t>(amax);  // BF16 values are F32 values with 16 zero low bits
    exponent_field = static_cast<int>(((bits + (1u << 21)) >> 23) & 0xFFu);
    if (exponent_field == 0xFF) return 255;
  }
  if (exponent_field == 0) return 0;  // log2(0) = −inf, clamped to 0
  // 127 + floor(log2(2^(e − bias))) − floor(log2(6)), clamped to the uint8 range.
  const int code = 127 + (exponent_field - bias) - 2;
  return static_cast<uint8_t>(std::clamp(code, 0, 255));
}

QuantizedMxfp4 quantize_mxfp4(std::span<const float> w, int64_t rows, int64_t cols, DType source) {
  check_source(source, "quantize_mxfp4");
  check_shape(w, rows, cols, kMxfp4GroupSize, "quantize_mxfp4");
  QuantizedMxfp4 out;
  out.rows = rows;
  out.cols = cols;
  const int64_t groups = cols / kMxfp4GroupSize;
  out.scales.resize(static_cast<size_t>(rows * groups));
  out.packed.assign(static_cast<size_t>(rows * cols / 2), 0);
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = w.data() + n * cols + g * kMxfp4GroupSize;
      uint8_t code = mxfp4_scale_code(group_abs_max(x, kMxfp4GroupSize), source);
      // CT keeps the scale as 2^(code − 127) in the observed dtype and divides in that dtype. In F16 a tiny
      // scale underflows to 0, which CT replaces by eps(uint8) = 1, i.e. code 127 once re-encoded.
      float scale = in_source(e8m0_to_float(code), source);
      if (scale == 0.0f) {
        scale = 1.0f;
        code = 127;
      }
      out.scales[static_cast<size_t>(n * groups + g)] = code;
      for (int64_t i = 0; i < kMxfp4GroupSize; ++i) {
        const uint8_t c = fp4_code(in_source(x[i] / scale, source));
        const size_t k = static_cast<size_t>(n * cols + g * kMxfp4GroupSize + i);
        out.packed[k / 2] |= static_cast<uint8_t>(k % 2 == 0 ? c : c << 4);
      }
    }
  }
  return out;
}

QuantizedInt4 quantize_int4(std::span<const float> w, int64_t rows, int64_t cols, int64_t group_size,
                            DType source) {
  check_source(source, "quantize_int4");
  check_shape(w, rows, cols, group_size, "quantize_int4");
  QuantizedInt4 out;
  out.rows = rows;
  out.cols = cols;
  out.group_size = group_size;
  out.scale_dtype = source;
  const int64_t groups = cols / group_size;
  const int64_t words = (cols + 7) / 8;
  out.scales.resize(static_cast<size_t>(rows * groups));
  out.packed.resize(static_cast<size_t>(rows * words));
  std::vector<int8_t> q(static_cast<size_t>(cols));
  // CT calculate_range for int4: [−8, 7]; calculate_qparams divides amax by (7 − (−8)) / 2 = 7.5.
  constexpr float kHalfRange = 7.5f;
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = w.data() + n * cols + g * group_size;
      float scale = in_source(group_abs_max(x, group_size) / kHalfRange, source);
      if (scale == 0.0f) scale = source_eps(source);
      out.scales[static_cast<size_t>(n * groups + g)] = scale;
      for (int64_t i = 0; i < group_size; ++i) {
        const float v = std::clamp(in_source(x[i] / scale, source), -8.0f, 7.0f);
        q[static_cast<size_t>(g * group_size + i)] = static_cast<int8_t>(std::nearbyint(v));  // ties to even
      }
    }
    pack_int4_row(q, std::span<int32_t>(out.packed).subspan(static_cast<size_t>(n * words),
                                                              static_cast<size_t>(words)));
  }
  return out;
}

}  // namespace fp4serve::quant
