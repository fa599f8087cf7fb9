// SPDX-License-Identifier: Apache-2.0
// Work partitioning of the CUDA kernels, as plain host functions (g++ and nvcc alike) so that the index
// arithmetic is unit-tested without a GPU (tests/backends/cuda/kernels/partition_test.cpp):
// - split-K of the tiled FP4 GEMM (m > 16): K chunks shared out among gridDim.z blocks per output tile;
// - the KV-length split of decode attention (flash-decoding: Dao et al., 2023, "Flash-Decoding for long-context
//   inference"): each (row, head) is cut into `splits` key ranges reduced by a second kernel;
// - the batch-size buckets of CUDA-graph capture (graph.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "backends/cuda/kernels/fp4_math.h"  // FP4SERVE_HD

namespace fp4serve::kernels::cuda {

/// First element of part `s` of `count` elements cut into `parts` contiguous ranges (part s is
/// [part_begin(s), part_begin(s + 1))): sizes differ by at most one and no part is empty when count ≥ parts.
FP4SERVE_HD inline int64_t part_begin(int64_t count, int64_t parts, int64_t s) { return s * count / parts; }

/// Output tile of one block of the tiled FP4 GEMM: 8 row tiles (128 output features) × 64 tokens.
inline constexpr int64_t kTiledRowTilesPerBlock = 8;
inline constexpr int64_t kTiledTokensPerBlock = 64;
/// A split never gets fewer than this many 64-column chunks (its partial sums would cost more than they save).
inline constexpr int64_t kMinChunksPerSplit = 2;
inline constexpr int64_t kMaxSplitK = 16;

/// Blocks of the tiled GEMM before any split: ⌈row_tiles/8⌉ · ⌈m/64⌉.
inline int64_t tiled_gemm_blocks(int64_t m, int64_t row_tiles) {
  return (row_tiles + kTiledRowTilesPerBlock - 1) / kTiledRowTilesPerBlock *
         ((m + kTiledTokensPerBlock - 1) / kTiledTokensPerBlock);
}

/// K splits of the tiled GEMM (gridDim.z): the most that keep all blocks in one wave of `multiprocessors`
/// (the tiled kernel runs one 256-thread block per SM: 134–138 registers per thread), capped at kMaxSplitK and at
/// col_chunks / kMinChunksPerSplit; 1 when the unsplit grid already fills the GPU. At 4096×4096 on 132 SMs,
/// m = 17…64 gives 32 blocks → 4 splits; m = 256 gives 128 blocks → 1.
inline int64_t plan_tiled_split_k(int64_t m, int64_t row_tiles, int64_t col_chunks, int multiprocessors) {
  const int64_t blocks = tiled_gemm_blocks(m, row_tiles);
  if (blocks <= 0) return 1;
  const int64_t fill = std::max<int64_t>(1, multiprocessors) / blocks;
  return std::clamp<int64_t>(std::min({fill, kMaxSplitK, col_chunks / kMinChunksPerSplit}), 1, kMaxSplitK);
}

/// fp32 partial sums a split tiled GEMM writes: splits · m · n, never more than
/// split_k_workspace_floats(multiprocessors) for a plan of plan_tiled_split_k (splits · blocks ≤ multiprocessors,
/// and a block covers at most 128 · 64 outputs).
inline int64_t split_k_partial_floats(int64_t splits, int64_t m, int64_t n) { return splits * m * n; }
inline int64_t split_k_workspace_floats(int multiprocessors) {
  return std::max<int64_t>(1, multiprocessors) * kTiledRowTilesPerBlock * 16 * kTiledTokensPerBlock;
}

/// Keys per split below which decode attention is not split (the merge would cost more than the parallelism
/// gains), and the most splits one (row, head) gets.
inline constexpr int64_t kMinKeysPerSplit = 256;
inline constexpr int64_t kMaxKvSplits = 32;

/// KV splits of decode attention for `rows` decode rows × `heads` query heads over at most `max_keys` keys:
/// enough blocks for about 4 per SM (the blocks are 128 threads), each split at least kMinKeysPerSplit keys,
/// at most kMaxKvSplits; 1 for short contexts. SmolLM2 (9 heads), 1 row, 4096 keys, 132 SMs → 16 splits.
inline int64_t plan_kv_splits(int64_t rows, int64_t heads, int64_t max_keys, int multiprocessors) {
  const int64_t base = std::max<int64_t>(1, rows * heads);
  const int64_t by_length = (max_keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  const int64_t by_fill = (4 * std::max<int64_t>(1, multiprocessors) + base - 1) / base;
  return std::clamp<int64_t>(std::min({by_length, by_fill, kMaxKvSplits}), 1, kMaxKvSplits);
}

/// Key range [lo, hi) of split `s` of `splits` for a query at position q_pos (keys 0 … q_pos, or the last
/// `window` of them when window > 0): the visible keys are cut into `splits` ranges of ⌈n/splits⌉ keys, the last
/// ones possibly short or empty (lo ≥ hi). The decode attention kernel computes exactly this on the device.
struct KeyRange {
  int64_t lo;
  int64_t hi;
};
FP4SERVE_HD inline KeyRange split_key_range(int64_t q_pos, int64_t window, int64_t splits, int64_t s) {
  const int64_t first = window > 0 && q_pos - window + 1 > 0 ? q_pos - window + 1 : 0;
  const int64_t n = q_pos + 1 - first;
  const int64_t per = (n + splits - 1) / splits;
  const int64_t lo = first + s * per;
  const int64_t hi = lo + per < q_pos + 1 ? lo + per : q_pos + 1;
  return {lo, hi};
}

/// Smallest bucket ≥ rows in `buckets` (ascending), or 0 when rows exceeds the largest (run without a graph).
inline int64_t graph_bucket(int64_t rows, std::span<const int64_t> buckets) {
  for (const int64_t b : buckets) {
    if (b >= rows) return b;
  }
  return 0;
}

}  // namespace fp4serve::kernels::cuda
