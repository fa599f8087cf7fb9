// SPDX-License-Identifier: Apache-2.0
// Test helpers: seeded random checkpoint tensors in the producers' layouts (docs/FORMATS.md §2, §3) and
// their float64 dequantization written from the format description, independently of src/prepare and
// src/backends/cpu/kernels. Shared by tests/prepare and tests/backends/cpu/kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/tensor_view.h"
#include "quant/formats.h"

namespace fp4serve::testing {

/// A tensor that owns its bytes; view() is what the repack functions take.
struct OwnedTensor {
  core::DType dtype = core::DType::U8;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;

  core::TensorView view() const { return core::TensorView{dtype, shape, std::span<const std::byte>(data)}; }
  template <typename T>
  static OwnedTensor from(core::DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
    OwnedTensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.data.resize(values.size() * sizeof(T));
    std::memcpy(t.data.data(), values.data(), t.data.size());
    return t;
  }
};

/// E2M1 values by code (FORMATS.md §0.1 table), independent of quant::e2m1_to_float.
inline double e2m1_value(unsigned code) {
  static constexpr double kMag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}

/// E4M3 byte value from the bit layout (FORMATS.md §0.2); NaN bytes are never generated here.
inline double e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}

/// bf16 bits of x with round-to-nearest-even (finite x).
inline uint16_t bf16_rne(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7FFFu + lsb) >> 16);
}

inline float bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// A quantized layer: its checkpoint tensors and W[n, k] in float64.
struct Layer {
  int64_t n = 0, k = 0;
  OwnedTensor weight, scale, zero_point, g_idx;
  bool has_zero_point = false, has_g_idx = false;
  float global_scale = 0.f;
  std::vector<double> w;  // [n, k]
};

/// Random E2M1 codes packed [n, k/2] (low nibble = even column), every code equally likely.
inline std::vector<uint8_t> random_fp4_codes(std::mt19937& rng, int64_t n, int64_t k) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n * k / 2));
  for (auto& b : bytes) b = static_cast<uint8_t>(rng() & 0xFF);
  return bytes;
}

/// NVFP4 as compressed-tensors (divisor) or ModelOpt (multiplier) writes it; E4M3 scales in [2^-9, 448].
inline Layer make_nvfp4(std::mt19937& rng, int64_t n, int64_t k, bool divisor) {
  Layer l;
  l.n = n;
  l.k = k;
  const auto codes = random_fp4_codes(rng, n, k);
  std::vector<uint8_t> scales(static_cast<size_t>(n * k / 16));
  for (auto& s : scales) {
    do s = static_cast<uint8_t>(rng() & 0x7F); while (s == 0x7F || s == 0);  // positive, not NaN, not zero
  }
  std::uniform_real_distribution<float> gdist(divisor ? 50.f : 1e-4f, divisor ? 4000.f : 2e-2f);
  l.global_scale = gdist(rng);
  l.weight = OwnedTensor::from(core::DType::U8, {n, k / 2}, codes);
  l.scale = OwnedTensor::from(core::DType::F8_E4M3, {n, k / 16}, scales);
  l.w.resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t byte = codes[static_cast<size_t>(r * k / 2 + c / 2)];
      const double q = e2m1_value(c % 2 == 0 ? byte & 0xF : byte >> 4);
      const double s = e4m3_value(scales[static_cast<size_t>(r * k / 16 + c / 16)]);
      l.w[static_cast<size_t>(r * k + c)] = divisor ? q * s / l.global_scale : q * s * l.global_scale;
    }
  }
  return l;
}

/// MXFP4: E8M0 scales around 2^0 (bytes 117..135) plus a few extreme ones.
inline Layer make_mxfp4(std::mt19937& rng, int64_t n, int64_t k) {
  Layer l;
  l.n = n;
  l.k = k;
  const auto codes = random_fp4_codes(rng, n, k);
  std::vector<uint8_t> scales(static_cast<size_t>(n * k / 32));
  for (auto& s : scales) s = static_cast<uint8_t>(117 + rng() % 19);
  if (scales.size() > 2) scales[1] = 1;  // 2^-126: products stay normal enough to check
  l.weight = OwnedTensor::from(core::DType::U8, {n, k / 2}, codes);
  l.scale = OwnedTensor::from(core::DType::U8, {n, k / 32}, scales);
  l.w.resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t byte = codes[static_cast<size_t>(r * k / 2 + c / 2)];
      const double q = e2m1_value(c % 2 == 0 ? byte & 0xF : byte >> 4);
      l.w[static_cast<size_t>(r * k + c)] = q * std::ldexp(1.0, scales[static_cast<size_t>(r * k / 32 + c / 32)] - 127);
    }
  }
  return l;
}

/// int4 pack-quantized: bf16 scales, optional asymmetric zero points (packed along rows) and a balanced
/// activation order (a random permutation of columns, `group` per group, as GPTQ actorder writes it).
inline Layer make_int4(std::mt19937& rng, int64_t n, int64_t k, int64_t group_size, bool asym, bool actorder) {
  Layer l;
  l.n = n;
  l.k = k;
  const int64_t group = group_size == -1 ? k : group_size;
  const int64_t groups = (k + group - 1) / group;
  std::vector<int32_t> gidx(static_cast<size_t>(k));
  for (int64_t c = 0; c < k; ++c) gidx[static_cast<size_t>(c)] = static_cast<int32_t>(c / group);
  if (actorder) std::shuffle(gidx.begin(), gidx.end(), rng);
  std::vector<int32_t> words(static_cast<size_t>(n * ((k + 7) / 8)), 0);
  std::vector<int> q(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const int v = static_cast<int>(rng() % 16) - 8;
      q[static_cast<size_t>(r * k + c)] = v;
      auto& word = words[static_cast<size_t>(r * ((k + 7) / 8) + c / 8)];
      word = static_cast<int32_t>(static_cast<uint32_t>(word) | (static_cast<uint32_t>(v + 8) << (4 * (c % 8))));
    }
  }
  std::uniform_real_distribution<float> sdist(1e-3f, 5e-2f);
  std::vector<uint16_t> scales(static_cast<size_t>(n * groups));
  for (auto& s : scales) s = bf16_rne(sdist(rng));
  std::vector<int> zp(static_cast<size_t>(n * groups), 0);
  std::vector<int32_t> zwords(static_cast<size_t>((n + 7) / 8 * groups), 0);
  if (asym) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const int z = static_cast<int>(rng() % 16) - 8;
        zp[static_cast<size_t>(r * groups + g)] = z;
        auto& word = zwords[static_cast<size_t>((r / 8) * groups + g)];
        word = static_cast<int32_t>(static_cast<uint32_t>(word) | (static_cast<uint32_t>(z + 8) << (4 * (r % 8))));
      }
    }
  }
  l.weight = OwnedTensor::from(core::DType::I32, {n, (k + 7) / 8}, words);
  l.scale = OwnedTensor::from(core::DType::BF16, {n, groups}, scales);
  l.has_zero_point = asym;
  if (asym) l.zero_point = OwnedTensor::from(core::DType::I32, {(n + 7) / 8, groups}, zwords);
  l.has_g_idx = actorder;
  if (actorder) l.g_idx = OwnedTensor::from(core::DType::I32, {k}, gidx);
  l.w.resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const auto g = static_cast<size_t>(r * groups + gidx[static_cast<size_t>(c)]);
      l.w[static_cast<size_t>(r * k + c)] = (q[static_cast<size_t>(r * k + c)] - zp[g]) * static_cast<double>(bf16_value(scales[g]));
    }
  }
  return l;
}

/// FP8 E4M3 weights with bf16 scales: kind 0 = tensor [1], 1 = channel [n, 1], 2 = block {bh, bw}.
inline Layer make_fp8(std::mt19937& rng, int64_t n, int64_t k, int kind, int64_t bh = 0, int64_t bw = 0) {
  Layer l;
  l.n = n;
  l.k = k;
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  for (auto& c : codes) {
    do c = static_cast<uint8_t>(rng() & 0xFF); while ((c & 0x7F) == 0x7F);
  }
  const int64_t sr = kind == 0 ? 1 : kind == 1 ? n : (n + bh - 1) / bh;
  const int64_t sc = kind == 2 ? (k + bw - 1) / bw : 1;
  std::uniform_real_distribution<float> sdist(1e-4f, 1e-2f);
  std::vector<uint16_t> scales(static_cast<size_t>(sr * sc));
  for (auto& s : scales) s = bf16_rne(sdist(rng));
  l.weight = OwnedTensor::from(core::DType::F8_E4M3, {n, k}, codes);
  std::vector<int64_t> shape = kind == 0 ? std::vector<int64_t>{1} : kind == 1 ? std::vector<int64_t>{n, 1}
                                                                               : std::vector<int64_t>{sr, sc};
  l.scale = OwnedTensor::from(core::DType::BF16, shape, scales);
  l.w.resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const int64_t si = kind == 0 ? 0 : kind == 1 ? r : (r / bh) * sc + c / bw;
      l.w[static_cast<size_t>(r * k + c)] =
          e4m3_value(codes[static_cast<size_t>(r * k + c)]) * static_cast<double>(bf16_value(scales[static_cast<size_t>(si)]));
    }
  }
  return l;
}

/// Unquantized weights: BF16 (bits), F16 or F32.
inline Layer make_dense(std::mt19937& rng, int64_t n, int64_t k, core::DType dtype) {
  Layer l;
  l.n = n;
  l.k = k;
  std::normal_distribution<float> dist(0.f, 0.05f);
  l.w.resize(static_cast<size_t>(n * k));
  std::vector<uint16_t> bits(static_cast<size_t>(n * k));
  std::vector<float> values(static_cast<size_t>(n * k));
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = dist(rng);
    if (dtype == core::DType::BF16) {
      bits[i] = bf16_rne(v);
      l.w[i] = bf16_value(bits[i]);
    } else if (dtype == core::DType::F16) {
      bits[i] = quant::float_to_f16(v);
      l.w[i] = quant::f16_to_float(bits[i]);
    } else {
      values[i] = v;
      l.w[i] = v;
    }
  }
  l.weight = dtype == core::DType::F32 ? OwnedTensor::from(dtype, {n, k}, values) : OwnedTensor::from(dtype, {n, k}, bits);
  return l;
}

}  // namespace fp4serve::testing
