// SPDX-License-Identifier: Apache-2.0
#include "backends/cpu/kernels/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backends/cpu/kernels/batch_invariant.h"
#include "backends/cpu/kernels/simd.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels {

int64_t kv_element_bytes(KvElement element) {
  switch (element) {
    case KvElement::F32: return 4;
    case KvElement::Bf16:
    case KvElement::F16: return 2;
  }
  return 4;
}

std::string_view kv_element_name(KvElement element) {
  switch (element) {
    case KvElement::F32: return "fp32";
    case KvElement::Bf16: return "bf16";
    case KvElement::F16: return "fp16";
  }
  return "?";
}

void write_kv_row(const float* src, int64_t n, KvElement element, void* dst) {
  cpu::store_kv_row(src, n, element, dst);
}

void attention(const float* q, int64_t t, int64_t start_pos, const float* k_cache, const float* v_cache,
               int64_t cache_row_stride, const AttentionParams& params, float* out) {
  attention(q, t, start_pos, KvRows{k_cache, v_cache, cache_row_stride, params.head_dim, KvElement::F32}, params, out);
}

namespace {

void check_heads(const AttentionParams& p) {
  if (p.num_heads < 1 || p.num_kv_heads < 1 || p.num_heads % p.num_kv_heads != 0 || p.head_dim < 1) {
    throw UsageError(fmt::format("attention: num_heads {} must be a positive multiple of num_kv_heads {}, head_dim {} >= 1",
                                 p.num_heads, p.num_kv_heads, p.head_dim));
  }
}

// Throws UsageError unless `cache` lays out the positions t rows from start_pos read (see attention.h).
void check_cache(const KvRows& cache, int64_t t, int64_t start_pos, const AttentionParams& p) {
  const int64_t cache_row_stride = cache.row_stride;
  const int64_t kv_heads = p.num_kv_heads;
  const int64_t d = p.head_dim;
  // The heads' rows must not overlap: rows of all heads together, or each head's positions together (of a block).
  const bool paged = cache.block_table != nullptr;
  const int64_t positions = paged ? cache.block_size : std::max<int64_t>(start_pos + t, 1);
  const bool rows_of_heads = cache.head_stride >= d && cache_row_stride >= kv_heads * cache.head_stride;
  const bool heads_of_rows = cache_row_stride >= d && cache.head_stride >= positions * cache_row_stride;
  if (t < 0 || start_pos < 0 || p.sliding_window < 0 || !(rows_of_heads || heads_of_rows)) {
    throw UsageError(fmt::format(
        "attention: t {} start_pos {} sliding_window {} must be >= 0, and the cache's row stride {} and head stride {} "
        "must lay out [positions][num_kv_heads {}][head_dim {}] or [num_kv_heads][positions {}][head_dim] without overlap",
        t, start_pos, p.sliding_window, cache_row_stride, cache.head_stride, kv_heads, d, positions));
  }
  if (paged) {
    const int64_t block_span = rows_of_heads ? cache.block_size * cache_row_stride : kv_heads * cache.head_stride;
    const int64_t first = p.sliding_window > 0 ? std::max<int64_t>(0, start_pos - p.sliding_window + 1) : 0;
    const int64_t last = start_pos + t - 1;
    if (cache.block_size < 1 || cache.block_stride < block_span || (t > 0 && last / cache.block_size >= cache.block_table_size)) {
      throw UsageError(fmt::format("attention: paged cache with block size {}, block stride {} (at least {}) and {} "
                                   "table entries cannot hold positions {} … {}",
                                   cache.block_size, cache.block_stride, block_span, cache.block_table_size, first, last));
    }
    for (int64_t b = first / cache.block_size; t > 0 && b <= last / cache.block_size; ++b) {
      if (cache.block_table[b] < 0) {
        throw UsageError(fmt::format("attention: block table entry {} (positions from {}) is empty but read", b,
                                     b * cache.block_size));
      }
    }
  }
}

// One query row: its H heads [H, D] at position `pos` over `cache`, its output [H, D].
struct QueryRow {
  const float* q;
  int64_t pos;
  const KvRows* cache;
  float* out;
};

// Attention of n query rows, row i = row_of(i) (a QueryRow), each attending to its own keys, in one parallel
// region: work items are (row, KV head), each reading each key/value row once for the H/KVH query heads that
// share it; with fewer items than 2 · threads each item's keys are split into ranges merged afterwards
// (flash-decoding). max_len: the most keys any row reads. The arithmetic of an item depends only on the number of
// key ranges (attention_key_splits of n rows), so a row gets the same bits in any call with as many ranges.
template <class RowOf>
void attend_rows(int64_t n, const RowOf& row_of, int64_t max_len, const AttentionParams& p) {
  const int64_t heads = p.num_heads, kv_heads = p.num_kv_heads, d = p.head_dim, group = heads / kv_heads;
  const auto keys_of = [&](int64_t pos) {
    const int64_t lo = p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
    return std::pair{lo, pos};
  };
  // Batch-invariant mode (batch_invariant.h): no key split (it depends on the threads and rows).
  const int64_t splits = batch_invariant() ? 1 : attention_key_splits(n, kv_heads, max_len, omp_get_max_threads());
  if (splits == 1) {
    // Rows with more keys cost more (the end of a prefill, the longer sequences of a decode step), hence dynamic.
#pragma omp parallel
    {
      std::vector<float> scores(static_cast<size_t>(group * max_len));
#pragma omp for schedule(dynamic, 1) collapse(2)
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
          const QueryRow row = row_of(i);
          const auto [lo, hi] = keys_of(row.pos);
          const int64_t h0 = kvh * group;
          cpu::attend_group(row.q + h0 * d, group, d, *row.cache, kvh, lo, hi, p.scale,
                            p.sinks != nullptr ? p.sinks + h0 : nullptr, scores.data(), row.out + h0 * d);
        }
      }
    }
    return;
  }
  // Each item's keys are split into `splits` ranges, each range gives per head its max score m_c,
  // Σ exp(s − m_c) and Σ exp(s − m_c)·v, and the ranges merge as
  // out = Σ_c e^(m_c − M)·o_c / (Σ_c e^(m_c − M)·l_c + e^(sink − M)), M = max(max_c m_c, sink).
  const int64_t items = n * kv_heads;
  const int64_t stats_size = 2 * group, part_size = group * d + stats_size;
  std::vector<float> parts(static_cast<size_t>(items * splits * part_size));
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(group * ((max_len + splits - 1) / splits)));
#pragma omp for schedule(static) collapse(2)
    for (int64_t item = 0; item < items; ++item) {
      for (int64_t c = 0; c < splits; ++c) {
        const int64_t i = item / kv_heads, kvh = item % kv_heads;
        const QueryRow row = row_of(i);
        const auto [lo, hi] = keys_of(row.pos);
        const int64_t len = hi - lo + 1;
        // Range c of `splits` near-equal ranges; a row with fewer keys than splits leaves some ranges empty.
        const int64_t c_lo = lo + len * c / splits, c_hi = lo + len * (c + 1) / splits - 1;
        float* part = parts.data() + (item * splits + c) * part_size;
        if (c_hi < c_lo) {
          for (int64_t g = 0; g < group; ++g) part[group * d + 2 * g] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const int64_t h0 = kvh * group;
        cpu::attend_group(row.q + h0 * d, group, d, *row.cache, kvh, c_lo, c_hi, p.scale, nullptr, scores.data(),
                          part, part + group * d);
      }
    }
  }
  for (int64_t item = 0; item < items; ++item) {
    const int64_t i = item / kv_heads, kvh = item % kv_heads;
    const QueryRow row = row_of(i);
    for (int64_t g = 0; g < group; ++g) {
      const int64_t h = kvh * group + g;
      const auto stat = [&](int64_t c, int64_t which) {
        return parts[static_cast<size_t>((item * splits + c) * part_size + group * d + 2 * g + which)];
      };
      float m = p.sinks != nullptr ? p.sinks[h] : -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < splits; ++c) m = std::max(m, stat(c, 0));
      float denom = p.sinks != nullptr ? std::exp(p.sinks[h] - m) : 0.f;
      float* o = row.out + h * d;
      std::fill(o, o + d, 0.f);
      for (int64_t c = 0; c < splits; ++c) {
        if (stat(c, 0) == -std::numeric_limits<float>::infinity()) continue;  // an empty range
        const float w = std::exp(stat(c, 0) - m);
        denom += w * stat(c, 1);
        const float* oc = parts.data() + (item * splits + c) * part_size + g * d;
        for (int64_t e = 0; e < d; ++e) o[e] += w * oc[e];
      }
      const float inv = 1.f / denom;
      for (int64_t e = 0; e < d; ++e) o[e] *= inv;
    }
  }
}

}  // namespace

void attention(const float* q, int64_t t, int64_t start_pos, const KvRows& cache, const AttentionParams& p,
               float* out) {
  check_heads(p);
  check_cache(cache, t, start_pos, p);
  if (t == 0) return;
  if (q == nullptr || cache.keys == nullptr || cache.values == nullptr || out == nullptr) {
    throw UsageError("attention: null pointer");
  }
  const int64_t row_width = p.num_heads * p.head_dim;
  const int64_t total = start_pos + t;
  const int64_t max_len = p.sliding_window > 0 ? std::min(p.sliding_window, total) : total;
  // Batch-invariant mode: every row by itself (attend_rows), never blocked (a prefill's rows would get other
  // arithmetic than a decode step's).
  const int64_t splits = attention_key_splits(t, p.num_kv_heads, max_len, omp_get_max_threads());
  if (!batch_invariant() && splits == 1 && t >= kMinBlockedPrefillRows &&
      cpu::prefill_attention(q, t, start_pos, cache, p, out)) {
    return;
  }
  attend_rows(
      t, [&](int64_t i) { return QueryRow{q + i * row_width, start_pos + i, &cache, out + i * row_width}; }, max_len, p);
}

void decode_attention(std::span<const DecodeQuery> rows, const AttentionParams& p) {
  check_heads(p);
  int64_t max_len = 1;
  for (const DecodeQuery& r : rows) {
    check_cache(r.cache, 1, r.pos, p);
    if (r.q == nullptr || r.cache.keys == nullptr || r.cache.values == nullptr || r.out == nullptr) {
      throw UsageError("decode_attention: null pointer");
    }
    max_len = std::max(max_len, p.sliding_window > 0 ? std::min(p.sliding_window, r.pos + 1) : r.pos + 1);
  }
  if (rows.empty()) return;
  attend_rows(
      static_cast<int64_t>(rows.size()),
      [&](int64_t i) {
        const DecodeQuery& r = rows[static_cast<size_t>(i)];
        return QueryRow{r.q, r.pos, &r.cache, r.out};
      },
      max_len, p);
}

bool prefill_attention_uses_bf16(KvElement element, const AttentionParams& params) {
  return !batch_invariant() && cpu::prefill_attention_bf16(element, params);
}

int64_t attention_key_splits(int64_t t, int64_t kv_heads, int64_t keys, int64_t threads) {
  const int64_t items = t * kv_heads;
  if (threads <= 1 || items >= 2 * threads) return 1;
  const int64_t wanted = (2 * threads + items - 1) / items;
  return std::max<int64_t>(1, std::min(wanted, keys / kMinKeysPerSplit));
}

}  // namespace fp4serve::kernels
