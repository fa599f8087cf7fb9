// SPDX-License-Identifier: Apache-2.0
#include "quant/formats.h"

#include <cmath>
#include <limits>

namespace fp4serve::quant {
namespace {

// A binary minifloat: 1 sign bit, `exp_bits` exponent bits with `bias`, `man_bits` mantissa bits.
struct Minifloat {
  int exp_bits;
  int man_bits;
  int bias;
  bool ieee_specials;  // all-ones exponent is inf/NaN (E5M2, F16); otherwise only `nan_code` is NaN
  uint32_t nan_code;   // magnitude code of the canonical NaN
  uint32_t max_code;   // magnitude code of the largest finite value
};

constexpr Minifloat kE2M1{2, 1, 1, false, 0, 0x7};
constexpr Minifloat kE4M3{4, 3, 7, false, 0x7F, 0x7E};
constexpr Minifloat kE5M2{5, 2, 15, true, 0x7E, 0x7B};
constexpr Minifloat kF16{5, 10, 15, true, 0x7E00, 0x7BFF};

double decode(const Minifloat& f, uint32_t code) {
  const uint32_t sign_bit = 1u << (f.exp_bits + f.man_bits);
  const bool negative = (code & sign_bit) != 0;
  const uint32_t magnitude = code & (sign_bit - 1);
  const uint32_t exp_field = magnitude >> f.man_bits;
  const uint32_t man_field = magnitude & ((1u << f.man_bits) - 1);
  double value;
  if (f.ieee_specials && exp_field == (1u << f.exp_bits) - 1) {
    value = man_field == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.ieee_specials && f.nan_code != 0 && magnitude == f.nan_code) {
    value = std::numeric_limits<double>::quiet_NaN();
  } else if (exp_field == 0) {
    value = std::ldexp(static_cast<double>(man_field), 1 - f.bias - f.man_bits);
  } else {
    value = std::ldexp(static_cast<double>(man_field + (1u << f.man_bits)),
                       static_cast<int>(exp_field) - f.bias - f.man_bits);
  }
  return negative ? -value : value;
}

// Round |x| to the format with round-to-nearest-even. Returns the magnitude code, which may exceed max_code
// when the value overflows (the caller saturates or maps to inf). Scaling by powers of two is exact in double,
// so std::nearbyint performs the one and only rounding.
uint32_t round_magnitude(const Minifloat& f, double magnitude) {
  if (magnitude == 0.0) return 0;
  const int emin = 1 - f.bias;  // exponent of the smallest normal
  int e;
  std::frexp(magnitude, &e);
  e -= 1;  // magnitude = m · 2^e with m in [1, 2)
  if (e < emin) {
    return static_cast<uint32_t>(std::nearbyint(std::ldexp(magnitude, f.man_bits - emin)));
  }
  const double m = std::nearbyint(std::ldexp(magnitude, f.man_bits - e));  // in [2^man, 2^(man+1)]
  // A carry to 2^(man+1) lands exactly on the next exponent's code.
  const double code = std::ldexp(static_cast<double>(e - emin + 1), f.man_bits) + (m - std::ldexp(1.0, f.man_bits));
  return code > 1e9 ? 0xFFFFFFFFu : static_cast<uint32_t>(code);
}

uint32_t sign_of(const Minifloat& f, float x) { return std::signbit(x) ? 1u << (f.exp_bits + f.man_bits) : 0u; }

}  // namespace

float e2m1_to_float(uint8_t code) { return static_cast<float>(decode(kE2M1, code & 0xFu)); }

uint8_t float_to_e2m1(float x) {
  if (std::isnan(x)) return 0;
  const double clamped = std::fmin(std::fabs(static_cast<double>(x)), 6.0);
  return static_cast<uint8_t>(sign_of(kE2M1, x) | round_magnitude(kE2M1, clamped));
}

float e4m3_to_float(uint8_t code) { return static_cast<float>(decode(kE4M3, code)); }

uint8_t float_to_e4m3(float x) {
  if (std::isnan(x)) return static_cast<uint8_t>(sign_of(kE4M3, x) | kE4M3.nan_code);
  const double clamped = std::fmin(std::fabs(static_cast<double>(x)), 448.0);
  return static_cast<uint8_t>(sign_of(kE4M3, x) | round_magnitude(kE4M3, clamped));
}

float e5m2_to_float(uint8_t code) { return static_cast<float>(decode(kE5M2, code)); }

uint8_t float_to_e5m2(float x) {
  const uint32_t sign = sign_of(kE5M2, x);
  if (std::isnan(x)) return static_cast<uint8_t>(sign | kE5M2.nan_code);
  const double magnitude = std::fabs(static_cast<double>(x));
  const uint32_t inf_code = 0x7C;
  if (std::isinf(magnitude)) return static_cast<uint8_t>(sign | inf_code);
  const uint32_t code = round_magnitude(kE5M2, magnitude);
  return static_cast<uint8_t>(sign | (code > kE5M2.max_code ? inf_code : code));
}

float e8m0_to_float(uint8_t code) { return std::ldexp(1.0f, static_cast<int>(code) - 127); }

float f16_to_float(uint16_t bits) { return static_cast<float>(decode(kF16, bits)); }

uint16_t float_to_f16(float x) {
  const uint32_t sign = sign_of(kF16, x);
  if (std::isnan(x)) return static_cast<uint16_t>(sign | kF16.nan_code);
  const double magnitude = std::fabs(static_cast<double>(x));
  const uint32_t inf_code = 0x7C00;
  if (std::isinf(magnitude)) return static_cast<uint16_t>(sign | inf_code);
  const uint32_t code = round_magnitude(kF16, magnitude);
  return static_cast<uint16_t>(sign | (code > kF16.max_code ? inf_code : code));
}

}  // namespace fp4serve::quant
