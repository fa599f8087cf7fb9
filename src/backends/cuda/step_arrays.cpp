// SPDX-License-Identifier: Apache-2.0
#include "backends/cuda/step_arrays.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <vector>
#include <algorithm>

#include "fp4serve/error.h"

namespace fp4serve::backends::cuda {
namespace {

template <class T>
void put(std::span<std::byte> out, size_t offset, int64_t index, T value) {
  std::memcpy(out.data() + offset + static_cast<size_t>(index) * sizeof(T), &value, sizeof(T));
}

}  // namespace

StepArraysLayout step_arrays_layout(int64_t rows, int64_t table_width, int64_t groups) {
  if (rows < 0 || table_width < 0 || groups < 1) {
    throw UsageError(fmt::format("step_arrays_layout: {} rows, table width {}, {} groups", rows, table_width, groups));
  }
  const auto n = static_cast<size_t>(rows);
  const auto g = static_cast<size_t>(groups);
  StepArraysLayout l;
  l.rows = rows;
  l.groups = groups;
  l.table_width = table_width;
  l.positions = 0;
  l.cache_rows = l.positions + n * sizeof(int64_t);
  l.ids = l.cache_rows + g * n * sizeof(int64_t);
  l.seq_len = l.ids + n * sizeof(int32_t);
  l.block_tables = l.seq_len + n * sizeof(int32_t);
  l.bytes = (l.block_tables + g * n * static_cast<size_t>(table_width) * sizeof(int32_t) + 7) / 8 * 8;
  return l;
}

int64_t padded_step_rows(const model::FlatBatch& flat, std::span<const int64_t> buckets) {
  const auto n = static_cast<int64_t>(flat.ids.size());
  if (!flat.decode || !flat.capturable) return n;
  for (const int64_t b : buckets) {
    if (b >= n) return b;
  }
  return n;
}

void pack_step_arrays(const model::FlatBatch& flat, const model::KvCache& cache, int64_t rows, int32_t scratch_block,
                      std::span<std::byte> out) {
  const auto n = static_cast<int64_t>(flat.ids.size());
  const int64_t width = model::kv_blocks_for(cache.max_seq_len(), cache.block_size());
  const int64_t groups = cache.num_groups();
  const StepArraysLayout l = step_arrays_layout(rows, width, groups);
  if (rows < n || out.size() < l.bytes || cache.max_seq_len() > INT32_MAX || scratch_block < 0 ||
      flat.positions.size() != flat.ids.size() || flat.slots.size() != flat.ids.size() ||
      flat.cache_rows.size() != flat.ids.size() * static_cast<size_t>(groups)) {
    throw UsageError(fmt::format("pack_step_arrays: {} rows for a batch of {}, {} bytes for {}, cache length {}, "
                                 "scratch block {}",
                                 rows, n, out.size(), l.bytes, cache.max_seq_len(), scratch_block));
  }
  const int64_t scratch_row = static_cast<int64_t>(scratch_block) * cache.layers_per_block() * cache.block_size();
  std::vector<int32_t> table(static_cast<size_t>(width));
  for (int64_t r = 0; r < rows; ++r) {
    const bool real = r < n;
    const auto i = static_cast<size_t>(r);
    const int64_t position = real ? flat.positions[i] : 0;
    put<int64_t>(out, l.positions, r, position);
    put<int32_t>(out, l.ids, r, real ? flat.ids[i] : 0);
    put<int32_t>(out, l.seq_len, r, static_cast<int32_t>(position + 1));
    for (int64_t g = 0; g < groups; ++g) {
      put<int64_t>(out, l.cache_rows, g * rows + r, real ? flat.cache_rows[static_cast<size_t>(g * n + r)] : scratch_row);
      std::ranges::fill(table, model::kNoBlock);
      if (real) {
        const std::span<const int32_t> t = cache.block_table(flat.slots[i], static_cast<int>(g));
        std::ranges::copy(t.first(std::min(t.size(), table.size())), table.begin());
      } else if (!table.empty()) {
        table[0] = scratch_block;
      }
      if (width > 0) {
        std::memcpy(out.data() + l.block_tables + static_cast<size_t>(g * rows + r) * table.size() * sizeof(int32_t),
                    table.data(), table.size() * sizeof(int32_t));
      }
    }
  }
}

}  // namespace fp4serve::backends::cuda
