// SPDX-License-Identifier: Apache-2.0
// Shared helpers for the kernel_ops tests: seeded inputs, NaN poisoning, and running a check once per SIMD
// target Highway compiled in (so the AVX-512, AVX2, SSE4, SSSE3 and scalar paths are each compared with the
// float64 references, not only the one the test machine would pick).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include "backends/cpu/kernels/attention.h"
#include "quant/formats.h"

namespace fp4serve::kernels::testing {

/// Uniform values in ±[lo, hi] with a random sign, so no element is zero.
inline std::vector<float> random_nonzero(size_t n, uint32_t seed, float lo = 0.05f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(lo, hi);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> v(n);
  for (float& x : v) x = sign(rng) ? mag(rng) : -mag(rng);
  return v;
}

inline std::vector<float> poisoned(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

/// x as a KV cache of `element`s holds it (quant::'s scalar rounding, independent of the kernels' vector code).
inline float kv_rounded(KvElement element, float x) {
  switch (element) {
    case KvElement::F32: return x;
    case KvElement::Bf16: return quant::bf16_to_float(quant::float_to_bf16(x));
    case KvElement::F16: return quant::f16_to_float(quant::float_to_f16(x));
  }
  return x;
}

/// Element `at` of a cache buffer of `element`s = x (an fp32 element takes two of the buffer's 16-bit words; NaN
/// stays NaN: the poison).
inline void kv_store(std::vector<uint16_t>& buffer, KvElement element, int64_t at, float x) {
  switch (element) {
    case KvElement::F32: reinterpret_cast<float*>(buffer.data())[at] = x; return;
    case KvElement::Bf16: buffer[static_cast<size_t>(at)] = quant::float_to_bf16(x); return;
    case KvElement::F16: buffer[static_cast<size_t>(at)] = quant::float_to_f16(x); return;
  }
}

/// Runs `fn(target_name)` once with dispatch forced to each compiled target the CPU supports, then restores
/// normal dispatch.
template <class Fn>
void for_each_simd_target(Fn fn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(std::string("SIMD target ") + hwy::TargetName(target));
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
}

/// Attention in float64 over a contiguous cache, the oracle of the attention kernels: queries q [t, H, D] at
/// positions start_pos …; causal, GQA (H / KVH query heads per KV head), an optional sliding window (the last
/// `window` positions, self included) and sinks (one extra logit per head in the softmax). `Case` has heads,
/// kv_heads, head_dim, t, start_pos, window and sinks.
/// k[p · row_stride + kvh · head_stride + e] is element e of KV head kvh's key at position p, likewise v.
template <class Case>
std::vector<double> attention_reference(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, int64_t row_stride, int64_t head_stride,
                                        const Case& c, float scale, const std::vector<float>& sinks) {
  const int64_t H = c.heads, D = c.head_dim, G = c.heads / c.kv_heads;
  std::vector<double> out(static_cast<size_t>(c.t * H * D), 0.0);
  for (int64_t i = 0; i < c.t; ++i) {
    const int64_t qpos = c.start_pos + i;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / G;
      std::vector<double> logit;
      std::vector<int64_t> pos;
      for (int64_t p = 0; p <= qpos; ++p) {
        if (c.window > 0 && qpos - p >= c.window) continue;  // keep the last W positions, self included
        double s = 0;
        for (int64_t e = 0; e < D; ++e) s += double(q[(i * H + h) * D + e]) * k[p * row_stride + kvh * head_stride + e];
        logit.push_back(s * scale);
        pos.push_back(p);
      }
      double m = *std::max_element(logit.begin(), logit.end());
      if (c.sinks) m = std::max(m, double(sinks[h]));
      double denom = c.sinks ? std::exp(double(sinks[h]) - m) : 0.0;
      for (double l : logit) denom += std::exp(l - m);
      for (size_t j = 0; j < pos.size(); ++j) {
        const double w = std::exp(logit[j] - m) / denom;
        for (int64_t e = 0; e < D; ++e) out[(i * H + h) * D + e] += w * v[pos[j] * row_stride + kvh * head_stride + e];
      }
    }
  }
  return out;
}

}  // namespace fp4serve::kernels::testing
