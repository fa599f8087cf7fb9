// SPDX-License-Identifier: Apache-2.0
// What gemm_int8.cpp's SIMD kernels and gemm_int8_scalar.cpp's scalar forms share: the activation quantizer's
// rule (quantize_int8_blocks, gemm_shared.h) and the quantized rows' arrays.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/prepare/prepared_linear.h"

namespace fp4serve::kernels {
struct Int8Rows {
  const int8_t* q;      // [rows][K], octet order: Q (coarse groups) or hi = ⌊(Q + 128)/256⌋ (fine groups)
  const int8_t* r;      // [rows][K], octet order: lo = Q − 256·hi (fine groups), 0 elsewhere
  const float* d;       // [rows][groups]: x ≈ Q·d
  const int32_t* neg_off;  // [rows][groups]: −12·Σ Q over the group
  const uint8_t* fine;  // [rows][groups]: 1 where Q has 16 bits (hi and lo), 0 where it is one int8
};

// Up to this many rows of x (a decode step, a small batch) are quantized by the calling thread before the parallel
// region: per row it is a few KiB of work, and the decode step calls this for every linear.
inline constexpr int64_t kSerialPrepRows = 8;

// quantize_int8_blocks' rule (gemm_shared.h), shared by its scalar and vector forms. The per-row threshold on
// (amax/127)²: fine_ratio² · the mean over the groups whose amax is finite and > 0 (amax [groups], NaN for a group
// holding a NaN).
inline double int8_fine_threshold(const std::vector<float>& amax, float fine_ratio) {
  double sum_d2 = 0;
  int64_t usable = 0;
  for (const float a : amax) {
    if (std::isfinite(a) && a > 0.f) {
      const double dg = static_cast<double>(a) / 127;
      sum_d2 += dg * dg;
      ++usable;
    }
  }
  return usable > 0 ? static_cast<double>(fine_ratio) * fine_ratio * sum_d2 / static_cast<double>(usable) : 0;
}

// One group's grid: degenerate (amax 0, inf or NaN: Q = 0, d = amax / top), else fine (|Q| ≤ 32512 = 127·256, so
// Q = 256·hi + lo splits into two int8) when (amax/127)² reaches the threshold, else coarse (|Q| ≤ 127).
struct Int8GroupGrid {
  bool degenerate, fine;
  float top;  // the largest |Q|
};
inline Int8GroupGrid int8_group_grid(float amax, double fine_threshold) {
  const bool degenerate = std::isnan(amax) || !std::isfinite(amax) || !(amax > 0.f);
  const double dg = static_cast<double>(amax) / 127;
  const bool fine = !degenerate && dg * dg >= fine_threshold;
  return {degenerate, fine, fine ? 32512.f : 127.f};
}

/// quantize_int8_blocks (gemm_shared.h) one element at a time: targets without the vector form, odd block sizes.
void quantize_int8_blocks_scalar(const float* x, int64_t m, int64_t k, int64_t block, bool octet_order,
                                 float fine_ratio, int8_t* q, int8_t* r, float* d, int32_t* neg_off, uint8_t* fine);

/// int8_gemm's integer math without SIMD on rows quantized by quantize_int8_blocks (octet order; blocks of
/// int8_activation_block(w) columns), for targets without the SIMD kernel: the same results up to the fp32 order
/// of the group sums.
void int8_scalar(const prepare::PreparedLinear& w, const Int8Rows& x, int64_t m, float* y);

}  // namespace fp4serve::kernels
