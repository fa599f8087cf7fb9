// SPDX-License-Identifier: Apache-2.0
// The per-row arrays a GPU decode step reads on the device, packed into one buffer so that a step costs one small
// host→device copy, and padded to a batch-size bucket so that a CUDA graph captured for that bucket (the CUDA
// backend's StepGraphs) can be replayed for any batch up to it: the graph bakes the buffer's address and the
// arrays' offsets, the copy before each replay refreshes the contents. Host-only (no CUDA), unit-tested in
// tests/backends/cuda/step_arrays_test.cpp in every build.
//
// Padding rows run real work whose results are ignored: token 0 at position 0 of the KV cache's scratch block
// (a block past the pool's num_blocks that no sequence owns), so they write and read only that block.
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
  int64_t groups = 1;     ///< the cache's layer groups (KvCache::num_groups)
  size_t positions = 0;   ///< int64 [rows]: the token's position in its sequence
  size_t cache_rows = 0;  ///< int64 [groups][rows]: FlatBatch::cache_rows (a group's first layer; row j adds
                          ///< j · block_size)
  size_t ids = 0;         ///< int32 [rows]: token id
  size_t seq_len = 0;     ///< int32 [rows]: keys a decode row attends to = position + 1
  int64_t table_width = 0;
  size_t block_tables = 0;  ///< int32 [groups][rows][table_width]: each row's block table of each group, kNoBlock
                            ///< past its end
  size_t bytes = 0;         ///< total, a multiple of 8
};

/// The layout for `rows` ≥ 0 rows with block tables of `table_width` ≥ 0 entries in `groups` ≥ 1 groups
/// (16 + 8 · groups + 4 · groups · table_width bytes per row, rounded up to 8 in all). Throws UsageError for
/// negative sizes.
StepArraysLayout step_arrays_layout(int64_t rows, int64_t table_width, int64_t groups = 1);

/// Rows a step runs on: the smallest bucket ≥ the batch's rows for a decode step that may be captured
/// (flat.decode && flat.capturable) when some bucket is large enough, else exactly the batch's rows.
/// `buckets` ascending (the CUDA backend: default_graph_buckets, 1, 2, 4, … 256).
int64_t padded_step_rows(const model::FlatBatch& flat, std::span<const int64_t> buckets);

/// Writes the arrays of `flat` padded to `rows` rows into `out` (at least step_arrays_layout(rows,
/// table_width, cache.num_groups()).bytes bytes, table_width = ⌈cache.max_seq_len() / cache.block_size()⌉): rows
/// r < flat.ids.size() from the batch (block table of group g = cache.block_table(slot, g)), rows past it as
/// padding (id 0, position 0, seq_len 1, cache row = scratch_block · layers_per_block · block_size, block table
/// [scratch_block, kNoBlock …] in every group). Throws
/// UsageError when rows < the batch's rows, `out` is too small, or the sizes are not positive (or the cache is
/// longer than int32 positions).
void pack_step_arrays(const model::FlatBatch& flat, const model::KvCache& cache, int64_t rows, int32_t scratch_block,
                      std::span<std::byte> out);

}  // namespace fp4serve::backends::cuda
