// SPDX-License-Identifier: Apache-2.0
// The scalar forms of gemm_int8.cpp: the activation quantizer's rule one element at a time, and the integer GEMM
// for targets without the SIMD kernel (declared in gemm_int8_rules.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backends/cpu/kernels/gemm_int8_rules.h"
#include "backends/cpu/kernels/gemm_shared.h"
#include "quant/formats.h"

namespace fp4serve::kernels {

namespace {
// Column j of an octet → its byte within the octet's 8 activation bytes (gemm_int8.cpp's layout note).
constexpr int kOctetSlot[8] = {0, 4, 1, 5, 2, 6, 3, 7};
}  // namespace

// The rule of quantize_int8_blocks one element at a time: targets without QuantizeInt8Impl, odd block sizes.
void quantize_int8_blocks_scalar(const float* x, int64_t m, int64_t k, int64_t block, bool octet_order,
                                 float fine_ratio, int8_t* q, int8_t* r, float* d, int32_t* neg_off, uint8_t* fine) {
  const int64_t groups = k / block;
  thread_local std::vector<float> amax;
  amax.resize(static_cast<size_t>(groups));
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * k;
    int8_t* qi = q + i * k;
    int8_t* ri = r + i * k;
    // Pass 1: amax per group (NaN if the group holds one).
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = xi + g * block;
      float a = 0.f;
      bool nan = false;
      for (int64_t j = 0; j < block; ++j) {
        a = std::max(a, std::fabs(xg[j]));
        nan = nan || std::isnan(xg[j]);
      }
      amax[static_cast<size_t>(g)] = nan ? std::numeric_limits<float>::quiet_NaN() : a;
    }
    const double fine_threshold = int8_fine_threshold(amax, fine_ratio);
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = xi + g * block;
      const float a = amax[static_cast<size_t>(g)];
      // A NaN input makes its block's scale NaN (Q = 0), so it reaches the outputs as in the fp32 path.
      const auto [degenerate, is_fine, top] = int8_group_grid(a, fine_threshold);
      const float inv = degenerate ? 0.f : top / a;
      int32_t sum = 0;
      for (int64_t j = 0; j < block; ++j) {
        // |x·inv| ≤ top up to one rounding; the clamp keeps it inside the grid whatever the rounding.
        const auto v = static_cast<int32_t>(degenerate ? 0.f : std::nearbyint(std::clamp(xg[j] * inv, -top, top)));
        // Q = 256·hi + lo with lo ∈ [−128, 127]: hi = ⌊(Q + 128) / 256⌋ ∈ [−127, 127].
        const int32_t hi = is_fine ? (v + 128) >> 8 : v;
        const int64_t col = g * block + j;
        const int64_t at = octet_order ? (col & ~int64_t{7}) + kOctetSlot[col & 7] : col;
        qi[at] = static_cast<int8_t>(hi);
        ri[at] = static_cast<int8_t>(is_fine ? v - 256 * hi : 0);
        sum += v;
      }
      d[i * groups + g] = std::isnan(a) ? a : a / top;
      if (neg_off != nullptr) neg_off[i * groups + g] = -12 * sum;
      if (fine != nullptr) fine[i * groups + g] = is_fine ? 1 : 0;
    }
  }
}

void int8_scalar(const prepare::PreparedLinear& w, const Int8Rows& x, int64_t m, float* y) {
  const int64_t k = w.in_features;
  const int64_t groups = w.groups();
  static constexpr int32_t kTwiceE2m1[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const auto big_q = [&](int64_t i, int64_t col, bool fine) {
    const int64_t at = i * k + (col & ~int64_t{7}) + (col % 2) * 4 + (col % 8) / 2;
    return fine ? 256 * x.q[at] + x.r[at] : int32_t{x.q[at]};
  };
  if (w.layout == prepare::WeightLayout::Int4) {
    // Per weight group: s · Σ_b d[b]·Σ nibble·Q + o · Σ_b d[b]·Σ Q (Int4Tiles' sums).
    const int64_t blocks = k / kInt4ActivationBlock;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t n = 0; n < w.out_features; ++n) {
        float total = 0.f;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t at = (n / prepare::kTileRows * groups + g) * prepare::kTileRows + n % prepare::kTileRows;
          const float s = w.scales.as<float>()[at], o = w.offsets.as<float>()[at];
          float dots = 0.f, xsum = 0.f;
          for (int64_t b = g * w.group_size / kInt4ActivationBlock; b < (g + 1) * w.group_size / kInt4ActivationBlock; ++b) {
            const bool fine = x.fine[i * blocks + b] != 0;
            int32_t sum = 0, sum_q = 0;
            for (int64_t col = b * kInt4ActivationBlock; col < (b + 1) * kInt4ActivationBlock; ++col) {
              const int32_t big = big_q(i, col, fine);
              sum += static_cast<int32_t>(prepare::prepared_nibble(w, n, col)) * big;
              sum_q += big;
            }
            dots += static_cast<float>(sum) * x.d[i * blocks + b];
            xsum += static_cast<float>(sum_q) * x.d[i * blocks + b];
          }
          total += s * dots + o * xsum;
        }
        y[i * w.out_features + n] = apply_epilogue(w, n, total);
      }
    }
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t n = 0; n < w.out_features; ++n) {
      float total = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        const bool fine = x.fine[i * groups + g] != 0;
        int32_t sum = 0;
        for (int64_t col = g * w.group_size; col < (g + 1) * w.group_size; ++col) {
          sum += kTwiceE2m1[prepare::prepared_nibble(w, n, col)] * big_q(i, col, fine);
        }
        const float s = quant::decode_block_scale(w.block_format, prepare::prepared_scale_byte(w, n, g));
        total += static_cast<float>(sum) * x.d[i * groups + g] * (0.5f * s);
      }
      y[i * w.out_features + n] = apply_epilogue(w, n, total);
    }
  }
}

}  // namespace fp4serve::kernels
