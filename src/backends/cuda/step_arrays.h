// SPDX-License-Identifier: Apache-2.0
// The per-row arrays a GPU decode step reads on the device, packed into one buffer so that a step costs one small
// host→device copy, and padded to a batch-size bucket so that a CUDA graph captured for that bucket (the CUDA
// backend's StepGraphs) can be replayed for any batch up to it: the graph bakes the buffer's address and the
// arrays' offsets, the copy before each replay refreshes the contents. Host-only (no CUDA), unit-tested in
// tests/backends/cuda/step_arrays_test.cpp in every build.
//
// Padding rows run real work whose results are ignored: token 0 at position 0 of the KV cache's scratch slot
// (a slot past the cache's max_slots that no sequence owns), so they write and read only that slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "model/backend.h"

namespace fp4serve::backends::cuda {

/// Byte offsets of the arrays for `rows` rows in the packed buffer; int64 arrays first, so every array is
/// aligned to its element size when the buffer is 8-byte aligned.
struct StepArraysLayout {
  int64_t rows = 0;
  size_t positions = 0;   ///< int64 [rows]: the token's position in its sequence
  size_t cache_rows = 0;  ///< int64 [rows]: FlatBatch::cache_rows (layer 0; layer l adds l · max_seq_len)
  size_t seq_base = 0;    ///< int64 [rows]: cache row of position 0 of the row's sequence (layer 0)
  size_t ids = 0;         ///< int32 [rows]: token id
  size_t seq_len = 0;     ///< int32 [rows]: keys a decode row attends to = position + 1
  size_t bytes = 0;       ///< total, a multiple of 8
};

/// The layout for `rows` ≥ 0 rows (32 bytes per row). Throws UsageError for rows < 0.
StepArraysLayout step_arrays_layout(int64_t rows);

/// Rows a step runs on: the smallest bucket ≥ the batch's rows for a decode step that may be captured
/// (flat.decode && flat.capturable) when some bucket is large enough, else exactly the batch's rows.
/// `buckets` ascending (the CUDA backend: default_graph_buckets, 1, 2, 4, … 256).
int64_t padded_step_rows(const model::FlatBatch& flat, std::span<const int64_t> buckets);

/// Writes the arrays of `flat` padded to `rows` rows into `out` (at least step_arrays_layout(rows).bytes bytes):
/// rows r < flat.ids.size() from the batch (seq_base = slot · num_layers · max_seq_len), rows past it as padding
/// (id 0, position 0, seq_len 1, cache row = seq_base = scratch_slot · num_layers · max_seq_len). Throws
/// UsageError when rows < the batch's rows, `out` is too small, or the sizes are not positive (or the cache is
/// longer than int32 positions).
void pack_step_arrays(const model::FlatBatch& flat, int64_t rows, int64_t num_layers, int64_t max_seq_len,
                      int scratch_slot, std::span<std::byte> out);

}  // namespace fp4serve::backends::cuda
