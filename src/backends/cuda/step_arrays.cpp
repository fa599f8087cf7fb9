// SPDX-License-Identifier: Apache-2.0
#include "backends/cuda/step_arrays.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>

#include "fp4serve/error.h"

namespace fp4serve::backends::cuda {
namespace {

template <class T>
void put(std::span<std::byte> out, size_t offset, int64_t index, T value) {
  std::memcpy(out.data() + offset + static_cast<size_t>(index) * sizeof(T), &value, sizeof(T));
}

}  // namespace

StepArraysLayout step_arrays_layout(int64_t rows) {
  if (rows < 0) throw UsageError(fmt::format("step_arrays_layout: {} rows", rows));
  const auto n = static_cast<size_t>(rows);
  StepArraysLayout l;
  l.rows = rows;
  l.positions = 0;
  l.cache_rows = l.positions + n * sizeof(int64_t);
  l.seq_base = l.cache_rows + n * sizeof(int64_t);
  l.ids = l.seq_base + n * sizeof(int64_t);
  l.seq_len = l.ids + n * sizeof(int32_t);
  l.bytes = l.seq_len + n * sizeof(int32_t);  // 32 · rows
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

void pack_step_arrays(const model::FlatBatch& flat, int64_t rows, int64_t num_layers, int64_t max_seq_len,
                      int scratch_slot, std::span<std::byte> out) {
  const auto n = static_cast<int64_t>(flat.ids.size());
  const StepArraysLayout l = step_arrays_layout(rows);
  if (rows < n || out.size() < l.bytes || num_layers < 1 || max_seq_len < 1 ||
      max_seq_len > INT32_MAX || scratch_slot < 0 ||
      flat.positions.size() != flat.ids.size() || flat.slots.size() != flat.ids.size() ||
      flat.cache_rows.size() != flat.ids.size()) {
    throw UsageError(fmt::format("pack_step_arrays: {} rows for a batch of {}, {} bytes for {}, {} layers, cache "
                                 "length {}, scratch slot {}",
                                 rows, n, out.size(), l.bytes, num_layers, max_seq_len, scratch_slot));
  }
  const int64_t per_slot = num_layers * max_seq_len;
  for (int64_t r = 0; r < rows; ++r) {
    const bool real = r < n;
    const auto i = static_cast<size_t>(r);
    const int64_t position = real ? flat.positions[i] : 0;
    const int64_t base = (real ? static_cast<int64_t>(flat.slots[i]) : scratch_slot) * per_slot;
    put<int64_t>(out, l.positions, r, position);
    put<int64_t>(out, l.cache_rows, r, real ? flat.cache_rows[i] : base);
    put<int64_t>(out, l.seq_base, r, base);
    put<int32_t>(out, l.ids, r, real ? flat.ids[i] : 0);
    put<int32_t>(out, l.seq_len, r, static_cast<int32_t>(position + 1));
  }
}

}  // namespace fp4serve::backends::cuda
