// SPDX-License-Identifier: Apache-2.0
// Runs of contiguous KV rows in a (possibly paged) KvRows: the attention kernels (simd_ops.cpp,
// attention_prefill.cpp) read a range of positions as runs, each within one block of a paged cache (the whole range
// for a contiguous one), so that every run is rows `stride` elements apart as the unpaged code reads them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backends/cpu/kernels/attention.h"

namespace fp4serve::kernels::cpu {

/// Element offset of KV head `kv_head` at position `pos` (its block must exist).
inline int64_t kv_offset(const KvRows& c, int64_t kv_head, int64_t pos) {
  if (c.block_table == nullptr) return pos * c.row_stride + kv_head * c.head_stride;
  return static_cast<int64_t>(c.block_table[pos / c.block_size]) * c.block_stride + (pos % c.block_size) * c.row_stride +
         kv_head * c.head_stride;
}

/// Calls f(j0, n, keys, values) for positions lo … hi of `kv_head` in runs: positions lo + j0 … lo + j0 + n − 1
/// start at `keys` / `values` (bytes, already offset), row_stride elements apart.
template <class F>
inline void for_each_kv_run(const KvRows& c, int64_t kv_head, int64_t lo, int64_t hi, F&& f) {
  const int64_t eb = c.element == KvElement::F32 ? 4 : 2;
  const auto* k = static_cast<const std::byte*>(c.keys);
  const auto* v = static_cast<const std::byte*>(c.values);
  if (c.block_table == nullptr) {
    if (hi >= lo) {
      const int64_t off = kv_offset(c, kv_head, lo) * eb;
      f(int64_t{0}, hi - lo + 1, k + off, v + off);
    }
    return;
  }
  for (int64_t p = lo; p <= hi;) {
    const int64_t n = std::min(c.block_size - p % c.block_size, hi - p + 1);
    const int64_t off = kv_offset(c, kv_head, p) * eb;
    f(p - lo, n, k + off, v + off);
    p += n;
  }
}

/// Prefetches rows ahead across the blocks of a paged cache, which sit anywhere in memory: a run's own prefetches
/// come too late for its first rows, so while one run is read the next `ahead` positions' rows are requested.
/// Into L2 (prefetcht1), not L1: the L1's few miss buffers fill up and each further prefetch then stalls the core,
/// while L2 holds many more requests in flight (bench_ops BM_DecodeAttentionPaged, 16 sequences × 192 positions,
/// default model heads, bf16, 2 threads on Zen 4: L1 prefetches took 1.5–1.6× the time of L2 ones; with a run's
/// own prefetches only, 310–444 µs against 163–171; the distance mattered little from 32 to 128 positions of 64
/// elements).
/// `base`: KvRows::keys or ::values; rows of `d` elements. Positions are absolute; each is requested at most once.
class KvRunPrefetcher {
 public:
  KvRunPrefetcher(const KvRows& c, const void* base, int64_t kv_head, int64_t d, int64_t hi, int64_t ahead)
      : c_(c), base_(static_cast<const char*>(base)), kv_head_(kv_head), d_(d), hi_(hi), ahead_(ahead) {}

  /// Requests the rows of positions up to `pos` + ahead (and at most hi) not requested yet, from `from` at the
  /// first call.
  void through(int64_t from, int64_t pos) {
    if (next_ < from) next_ = from;
    const int64_t end = std::min(hi_ + 1, pos + ahead_);
    const int64_t eb = c_.element == KvElement::F32 ? 4 : 2;
    while (next_ < end) {
      const int64_t n =
          c_.block_table == nullptr ? end - next_ : std::min(c_.block_size - next_ % c_.block_size, end - next_);
      const char* row = base_ + kv_offset(c_, kv_head_, next_) * eb;
      const int64_t bytes = ((n - 1) * c_.row_stride + d_) * eb;
      for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, 2);  // locality 2: prefetcht1
      next_ += n;
    }
  }

 private:
  const KvRows& c_;
  const char* base_;
  int64_t kv_head_, d_, hi_, ahead_;
  int64_t next_ = -1;
};

}  // namespace fp4serve::kernels::cpu
