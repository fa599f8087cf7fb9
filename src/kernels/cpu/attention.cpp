// SPDX-License-Identifier: Apache-2.0
#include "kernels/attention.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "fp4serve/error.h"
#include "kernels/cpu/simd.h"

namespace fp4serve::kernels {

void attention(const float* q, int64_t t, int64_t start_pos, const float* k_cache, const float* v_cache,
               int64_t cache_row_stride, const AttentionParams& p, float* out) {
  const int64_t heads = p.num_heads;
  const int64_t kv_heads = p.num_kv_heads;
  const int64_t d = p.head_dim;
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || d < 1) {
    throw UsageError(fmt::format("attention: num_heads {} must be a positive multiple of num_kv_heads {}, head_dim {} >= 1",
                                 heads, kv_heads, d));
  }
  if (t < 0 || start_pos < 0 || cache_row_stride < kv_heads * d || p.sliding_window < 0) {
    throw UsageError(fmt::format(
        "attention: t {} start_pos {} sliding_window {} must be >= 0 and cache_row_stride {} >= num_kv_heads·head_dim {}",
        t, start_pos, p.sliding_window, cache_row_stride, kv_heads * d));
  }
  if (t == 0) return;
  if (q == nullptr || k_cache == nullptr || v_cache == nullptr || out == nullptr) {
    throw UsageError("attention: null pointer");
  }
  const int64_t group = heads / kv_heads;
  const int64_t total = start_pos + t;
  const int64_t max_len = p.sliding_window > 0 ? std::min(p.sliding_window, total) : total;

  // Work items are (query row, KV head). Rows near the end of a prefill attend to more keys, hence dynamic.
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(group * max_len));
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
        const int64_t hi = start_pos + i;
        const int64_t lo = p.sliding_window > 0 ? std::max<int64_t>(0, hi - p.sliding_window + 1) : 0;
        const int64_t h0 = kvh * group;
        cpu::attend_group(q + (i * heads + h0) * d, group, d, k_cache + kvh * d, v_cache + kvh * d,
                          cache_row_stride, lo, hi, p.scale, p.sinks != nullptr ? p.sinks + h0 : nullptr,
                          scores.data(), out + (i * heads + h0) * d);
      }
    }
  }
}

}  // namespace fp4serve::kernels
