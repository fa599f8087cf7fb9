// SPDX-License-Identifier: Apache-2.0
// Element and scale formats of quantized checkpoints: one constexpr traits table plus bit-exact decode/encode
// with the rounding the reference tools use (docs/FORMATS.md §0). Every later module takes format facts from
// here; kernels keep their own fast paths but are tested against these functions.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace fp4serve::quant {

enum class ElementFormat : uint8_t {
  E2M1,         ///< FP4: sign, 2 exponent bits (bias 1), 1 mantissa bit; ±{0, .5, 1, 1.5, 2, 3, 4, 6}; no inf/NaN
  E4M3,         ///< FP8 "e4m3fn": bias 7, max ±448, 0x7F/0xFF NaN, no inf
  E5M2,         ///< FP8 e5m2: IEEE-like, bias 15, max ±57344, inf and NaN
  E8M0,         ///< MX scale: unsigned exponent byte, value 2^(b−127)
  BF16,         ///< bfloat16
  F16,          ///< IEEE binary16
  F32,          ///< IEEE binary32
  Int4InInt32,  ///< compressed-tensors pack-quantized: eight int4 per little-endian int32, stored q + 8
  Uint4InUint8, ///< two's-complement int4 nibbles, two per byte (ModelOpt AWQ; packed along rows)
};

struct FormatTraits {
  ElementFormat format;
  std::string_view name;
  uint8_t bits;                 ///< bits of one element
  bool is_float;                ///< floating-point element (false: integer code)
  bool is_signed;               ///< carries a sign (E8M0 does not)
  float max_finite;             ///< largest finite magnitude (integer formats: largest |q|)
  core::DType storage;          ///< safetensors dtype the producers store it as
  uint8_t elements_per_storage; ///< elements per storage element (2 for FP4 in U8, 8 for int4 in I32)
};

inline constexpr std::array<FormatTraits, 9> kFormatTraits{{
    {ElementFormat::E2M1, "E2M1", 4, true, true, 6.0f, core::DType::U8, 2},
    {ElementFormat::E4M3, "E4M3", 8, true, true, 448.0f, core::DType::F8_E4M3, 1},
    {ElementFormat::E5M2, "E5M2", 8, true, true, 57344.0f, core::DType::F8_E5M2, 1},
    {ElementFormat::E8M0, "E8M0", 8, true, false, 1.7014118346046923e38f, core::DType::U8, 1},
    {ElementFormat::BF16, "BF16", 16, true, true, 3.3895313892515355e38f, core::DType::BF16, 1},
    {ElementFormat::F16, "F16", 16, true, true, 65504.0f, core::DType::F16, 1},
    {ElementFormat::F32, "F32", 32, true, true, 3.4028234663852886e38f, core::DType::F32, 1},
    {ElementFormat::Int4InInt32, "int4-in-int32", 4, false, true, 8.0f, core::DType::I32, 8},
    {ElementFormat::Uint4InUint8, "int4-in-uint8", 4, false, true, 8.0f, core::DType::U8, 2},
}};

constexpr const FormatTraits& format_traits(ElementFormat f) { return kFormatTraits[static_cast<size_t>(f)]; }

// --- FP4 E2M1 (FORMATS.md §0.1) --------------------------------------------------------------------------

/// Value of the low 4 bits of `code` (the high bits are ignored).
float e2m1_to_float(uint8_t code);

/// Nearest E2M1 code: clamp to ±6, round to nearest with ties to the even code (compressed-tensors
/// `fp4_utils.py`, ModelOpt `e2m1_bounds`). −0.0 keeps its sign (code 0x8). NaN encodes to +0 (0x0); the
/// references never feed NaN here because their scales are finite.
uint8_t float_to_e2m1(float x);

// --- FP8 -------------------------------------------------------------------------------------------------

/// Exact value of an E4M3 (e4m3fn) byte; 0x7F and 0xFF are NaN.
float e4m3_to_float(uint8_t code);

/// RNE to E4M3 with saturation to ±448 (compressed-tensors clamps before the cast); NaN → 0x7F.
uint8_t float_to_e4m3(float x);

/// Exact value of an E5M2 byte (IEEE-style inf and NaN).
float e5m2_to_float(uint8_t code);

/// RNE to E5M2 without saturation (as torch and ml_dtypes cast): overflow → ±inf; NaN → 0x7E (sign kept).
uint8_t float_to_e5m2(float x);

/// 2^(b − 127). b = 255 (NaN in OCP MX) decodes to +inf, as the reference decoders (HF `ldexp`, CT `2**(b−127)`)
/// do: FORMATS.md §0.2. b = 0 gives 2^−127, an fp32 subnormal.
float e8m0_to_float(uint8_t code);

// --- 16-bit floats ---------------------------------------------------------------------------------------

/// bfloat16 bits → float (exact).
inline float bf16_to_float(uint16_t bits);
/// float → bfloat16 bits with RNE; NaN stays a quiet NaN with its sign.
inline uint16_t float_to_bf16(float x);

/// IEEE half bits → float (exact).
float f16_to_float(uint16_t bits);
/// float → IEEE half bits with RNE; overflow → ±inf; NaN stays a quiet NaN with its sign.
uint16_t float_to_f16(float x);

}  // namespace fp4serve::quant

#include "quant/formats_inl.h"
