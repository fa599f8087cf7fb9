// SPDX-License-Identifier: Apache-2.0
// The host side of GPU decode steps (backends/cuda/step_arrays.h): which steps are decode steps, the rows a step is
// padded to, and the packed per-row arrays a captured graph reads, unpacked here and checked field by field
// against values computed in the test from the batch.
#include "backends/cuda/step_arrays.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "fp4serve/error.h"

namespace fp4serve::backends::cuda {
using model::FlatBatch;
using model::flatten_batch;
using model::SequenceChunk;
namespace {

template <class T>
std::vector<T> unpack(const std::vector<std::byte>& bytes, size_t offset, int64_t rows) {
  std::vector<T> out(static_cast<size_t>(rows));
  std::memcpy(out.data(), bytes.data() + offset, out.size() * sizeof(T));
  return out;
}

const std::vector<int64_t> kBuckets = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256};

TEST(StepArrays, DecodeStepsAreBatchesOfOneTokenChunks) {
  const std::vector<int32_t> one = {7}, two = {7, 8};
  const auto flat = [](std::vector<SequenceChunk> b) {
    model::KvCache cache(2, 1, 4, model::KvCacheSpec{32, 4});
    return flatten_batch(b, cache, 100);
  };
  EXPECT_TRUE(flat({{0, 5, one, false}}).decode);
  EXPECT_TRUE(flat({{0, 5, one, false}, {3, 0, one, true}, {1, 9, one, false}}).decode);
  EXPECT_FALSE(flat({{0, 5, two, false}}).decode);
  EXPECT_FALSE(flat({{0, 5, one, false}, {1, 0, two, false}}).decode);
  // A decode step wants every row's logits, in row order, all_logits or not (the decoder's decode path relies on
  // it: lm_head runs on all rows and the first rows are copied back).
  EXPECT_EQ(flat({{2, 5, one, true}, {0, 0, one, false}, {1, 3, one, false}}).logit_rows,
            (std::vector<int64_t>{0, 1, 2}));
  EXPECT_FALSE(flat({{0, 5, one, false}}).capturable) << "the decoder, not flatten_batch, decides";
}

TEST(StepArrays, CapturableDecodeStepsArePaddedToTheirBucket) {
  FlatBatch f;
  const auto rows_for = [&](int64_t n, bool decode, bool capturable) {
    f.ids.assign(static_cast<size_t>(n), 1);
    f.decode = decode;
    f.capturable = capturable;
    return padded_step_rows(f, kBuckets);
  };
  EXPECT_EQ(rows_for(1, true, true), 1);
  EXPECT_EQ(rows_for(3, true, true), 4);
  EXPECT_EQ(rows_for(17, true, true), 24);
  EXPECT_EQ(rows_for(200, true, true), 256);
  EXPECT_EQ(rows_for(256, true, true), 256);
  EXPECT_EQ(rows_for(257, true, true), 257) << "above the largest bucket: eager, unpadded";
  EXPECT_EQ(rows_for(3, true, false), 3) << "not capturable (MoE, observer): no padding";
  EXPECT_EQ(rows_for(3, false, true), 3) << "prefill: no padding";
}

TEST(StepArrays, LayoutIsAlignedAndDisjoint) {
  for (const int64_t rows : {0, 1, 3, 4, 255, 256}) {
    for (const int64_t width : {0, 1, 3, 8}) {
      const StepArraysLayout l = step_arrays_layout(rows, width);
      const auto n = static_cast<size_t>(rows), w = static_cast<size_t>(width);
      EXPECT_EQ(l.positions % 8, 0u);
      EXPECT_EQ(l.cache_rows % 8, 0u);
      EXPECT_EQ(l.ids % 4, 0u);
      EXPECT_EQ(l.seq_len % 4, 0u);
      EXPECT_EQ(l.block_tables % 4, 0u);
      // [begin, end) of each array, sorted by offset: consecutive, covering `bytes` up to its rounding to 8.
      EXPECT_EQ(l.cache_rows, l.positions + 8 * n);
      EXPECT_EQ(l.ids, l.cache_rows + 8 * n);
      EXPECT_EQ(l.seq_len, l.ids + 4 * n);
      EXPECT_EQ(l.block_tables, l.seq_len + 4 * n);
      EXPECT_EQ(l.bytes, (l.block_tables + 4 * n * w + 7) / 8 * 8);
    }
  }
  EXPECT_THROW(step_arrays_layout(-1, 0), UsageError);
  EXPECT_THROW(step_arrays_layout(1, -1), UsageError);
}

TEST(StepArrays, PackWritesTheBatchThenScratchPadding) {
  constexpr int64_t kLayers = 3, kSeq = 50, kBlock = 16, kWidth = 4;  // ⌈50 / 16⌉ table entries
  constexpr int kSlots = 6;
  model::KvCache cache(kLayers, 1, 4, model::KvCacheSpec{kSeq, kSlots, 40, kBlock});
  const std::vector<int32_t> a = {11}, b = {12}, c = {13};
  const std::vector<SequenceChunk> batch = {{4, 17, a, false}, {0, 0, b, false}, {2, 49, c, true}};
  FlatBatch flat = flatten_batch(batch, cache, 100);
  flat.capturable = true;
  const int64_t rows = padded_step_rows(flat, kBuckets);
  ASSERT_EQ(rows, 4);
  const StepArraysLayout l = step_arrays_layout(rows, kWidth);
  std::vector<std::byte> bytes(l.bytes + 8, std::byte{0xAB});
  constexpr int32_t kScratch = 40;
  pack_step_arrays(flat, cache, rows, kScratch, bytes);

  EXPECT_EQ(unpack<int64_t>(bytes, l.positions, rows), (std::vector<int64_t>{17, 0, 49, 0}));
  std::vector<int64_t> want_rows = flat.cache_rows;
  want_rows.push_back(kScratch * kLayers * kBlock);
  EXPECT_EQ(unpack<int64_t>(bytes, l.cache_rows, rows), want_rows);
  EXPECT_EQ(unpack<int32_t>(bytes, l.ids, rows), (std::vector<int32_t>{11, 12, 13, 0}));
  EXPECT_EQ(unpack<int32_t>(bytes, l.seq_len, rows), (std::vector<int32_t>{18, 1, 50, 1}));
  // Each row's block table padded with kNoBlock; the padding row reads the scratch block only.
  std::vector<int32_t> want_tables;
  for (const int slot : {4, 0, 2}) {
    std::vector<int32_t> t(cache.block_table(slot).begin(), cache.block_table(slot).end());
    t.resize(kWidth, model::kNoBlock);
    want_tables.insert(want_tables.end(), t.begin(), t.end());
  }
  want_tables.insert(want_tables.end(), {kScratch, model::kNoBlock, model::kNoBlock, model::kNoBlock});
  EXPECT_EQ(unpack<int32_t>(bytes, l.block_tables, rows * kWidth), want_tables);
  EXPECT_EQ(cache.block_table(4).size(), 2u);
  EXPECT_EQ(cache.block_table(2).size(), 4u);
  for (size_t i = l.bytes; i < bytes.size(); ++i) EXPECT_EQ(bytes[i], std::byte{0xAB}) << "wrote past the layout";

  // Unpadded (eager) packing of the same batch: the same real rows, no padding row.
  const StepArraysLayout l3 = step_arrays_layout(3, kWidth);
  std::vector<std::byte> exact(l3.bytes);
  pack_step_arrays(flat, cache, 3, kScratch, exact);
  EXPECT_EQ(unpack<int32_t>(exact, l3.seq_len, 3), (std::vector<int32_t>{18, 1, 50}));
  EXPECT_EQ(unpack<int64_t>(exact, l3.cache_rows, 3), flat.cache_rows);
}

// Layers of two windows (GPT-OSS: layer 0 slides, layer 1 attends to all): each group has its cache rows and
// block tables, group after group, and a padding row points at the scratch block in both.
TEST(StepArrays, PackWritesEveryLayerGroupsRowsAndTables) {
  constexpr int64_t kBlock = 4, kWidth = 5;  // ⌈20 / 4⌉
  model::KvCacheSpec spec{20, 2, 30, kBlock};
  spec.layer_windows = {6, 0};
  model::KvCache cache(2, 1, 4, spec);
  ASSERT_EQ(cache.num_groups(), 2);
  ASSERT_EQ(cache.layers_per_block(), 1);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  const int s = cache.acquire();
  cache.prepare(s, 0, 13);
  cache.commit(s, 0, prompt);  // position 13 reads 8 …: the sliding group's blocks 0, 1 are released
  const std::vector<int32_t> next = {14}, other = {15};
  const std::vector<SequenceChunk> batch = {{s, 13, next, false}, {1, 0, other, false}};
  FlatBatch flat = flatten_batch(batch, cache, 100);
  ASSERT_EQ(flat.cache_rows.size(), 4u);
  EXPECT_EQ(flat.cache_rows[0], cache.block_table(s, 0)[3] * kBlock + 1);
  EXPECT_EQ(flat.cache_rows[2], cache.block_table(s, 1)[3] * kBlock + 1);
  EXPECT_EQ(flat.cache_rows[3], cache.block_table(1, 1)[0] * kBlock);
  flat.capturable = true;
  const int64_t rows = padded_step_rows(flat, kBuckets);
  ASSERT_EQ(rows, 2);
  const StepArraysLayout l = step_arrays_layout(3, kWidth, 2);
  std::vector<std::byte> bytes(l.bytes);
  constexpr int32_t kScratch = 30;
  pack_step_arrays(flat, cache, 3, kScratch, bytes);  // one padding row
  EXPECT_EQ(unpack<int64_t>(bytes, l.cache_rows, 6),
            (std::vector<int64_t>{flat.cache_rows[0], flat.cache_rows[1], kScratch * kBlock, flat.cache_rows[2],
                                  flat.cache_rows[3], kScratch * kBlock}));
  std::vector<int32_t> want;
  for (int g = 0; g < 2; ++g) {
    for (const int slot : {s, 1}) {
      std::vector<int32_t> t(cache.block_table(slot, g).begin(), cache.block_table(slot, g).end());
      t.resize(kWidth, model::kNoBlock);
      want.insert(want.end(), t.begin(), t.end());
    }
    want.insert(want.end(), {kScratch, model::kNoBlock, model::kNoBlock, model::kNoBlock, model::kNoBlock});
  }
  EXPECT_EQ(unpack<int32_t>(bytes, l.block_tables, 2 * 3 * kWidth), want);
  EXPECT_EQ(want[static_cast<size_t>(3 * kWidth)], model::kNoBlock) << "the sliding group's released block 0";
  EXPECT_EQ(step_arrays_layout(3, kWidth, 2).ids, l.cache_rows + 2 * 3 * 8);
  EXPECT_THROW(step_arrays_layout(3, kWidth, 0), UsageError);
}

TEST(StepArrays, PackRefusesTooFewRowsOrBytes) {
  model::KvCache cache(2, 1, 4, model::KvCacheSpec{8, 2, 4, 4});
  const std::vector<int32_t> a = {1};
  const std::vector<SequenceChunk> batch = {{0, 0, a, false}, {1, 0, a, false}};
  const FlatBatch flat = flatten_batch(batch, cache, 10);
  std::vector<std::byte> bytes(step_arrays_layout(4, 2).bytes);
  EXPECT_THROW(pack_step_arrays(flat, cache, 1, 4, bytes), UsageError);
  EXPECT_THROW(pack_step_arrays(flat, cache, 4, 4, std::span(bytes).first(bytes.size() - 1)), UsageError);
  EXPECT_THROW(pack_step_arrays(flat, cache, 4, -1, bytes), UsageError);
  EXPECT_NO_THROW(pack_step_arrays(flat, cache, 4, 4, bytes));
}

}  // namespace
}  // namespace fp4serve::backends::cuda
