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

}  // namespace fp4serve::kernels::cpu
