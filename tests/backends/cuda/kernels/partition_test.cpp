// SPDX-License-Identifier: Apache-2.0
// Host-only: the index arithmetic of the CUDA kernels' work partitioning (backends/cuda/kernels/partition.h) and the
// host side of StepGraphs (graph.h). Every property is checked by enumeration against a plain count, on shapes
// that include the odd ones (K % 64 ≠ 0, N ≥ 8448, vocab-sized N, odd M). Runs on every machine.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "backends/cuda/kernels/graph.h"
#include "backends/cuda/kernels/partition.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels::cuda {
namespace {

TEST(CudaPartition, PartsCoverEveryElementOnceAndDifferByAtMostOne) {
  for (const int64_t count : {1, 2, 7, 9, 64, 65, 129, 2375}) {
    for (const int64_t parts : {1, 2, 3, 4, 8, 16, 32}) {
      std::vector<int> hits(static_cast<size_t>(count), 0);
      int64_t smallest = count, largest = 0;
      for (int64_t s = 0; s < parts; ++s) {
        const int64_t lo = part_begin(count, parts, s), hi = part_begin(count, parts, s + 1);
        ASSERT_LE(lo, hi);
        smallest = std::min(smallest, hi - lo);
        largest = std::max(largest, hi - lo);
        for (int64_t i = lo; i < hi; ++i) ++hits[static_cast<size_t>(i)];
      }
      for (const int h : hits) ASSERT_EQ(h, 1) << count << " in " << parts;
      EXPECT_LE(largest - smallest, 1);
      if (count >= parts) {
        EXPECT_GE(smallest, 1) << "an empty part of " << count << " in " << parts;
      }
    }
  }
}

TEST(CudaPartition, TiledSplitKFillsOneWaveAndFitsTheWorkspace) {
  // 132 SMs (H200), 108 (A100), 1, and a small GPU.
  for (const int sms : {132, 108, 1, 20}) {
    for (const int64_t n : {64, 200, 576, 1536, 4096, 8192, 8448, 28672, 49152, 151936}) {
      for (const int64_t k : {64, 80, 576, 592, 1536, 4096, 8192}) {
        const int64_t row_tiles = (n + 15) / 16, chunks = (k + 63) / 64;
        for (const int64_t m : {17, 33, 64, 65, 97, 128, 200, 255, 256, 4096}) {
          SCOPED_TRACE(::testing::Message() << "SMs " << sms << " N " << n << " K " << k << " M " << m);
          const int64_t splits = plan_tiled_split_k(m, row_tiles, chunks, sms);
          const int64_t blocks = tiled_gemm_blocks(m, row_tiles);
          ASSERT_GE(splits, 1);
          ASSERT_LE(splits, kMaxSplitK);
          if (splits > 1) {
            EXPECT_LE(splits * blocks, sms) << "a split plan must stay in one wave";
            EXPECT_GE(chunks / splits, kMinChunksPerSplit) << "splits too thin";
            // Every split gets chunks, and the partial sums fit the fixed workspace.
            EXPECT_GE(part_begin(chunks, splits, 1), 1);
            EXPECT_LE(split_k_partial_floats(splits, m, n), split_k_workspace_floats(sms));
          }
          if (blocks >= sms) {
            EXPECT_EQ(splits, 1) << "the unsplit grid already fills the GPU";
          }
        }
      }
    }
  }
  // The figures the header quotes: 4096² on 132 SMs.
  EXPECT_EQ(plan_tiled_split_k(17, 256, 64, 132), 4);
  EXPECT_EQ(plan_tiled_split_k(64, 256, 64, 132), 4);
  EXPECT_EQ(plan_tiled_split_k(65, 256, 64, 132), 2);
  EXPECT_EQ(plan_tiled_split_k(256, 256, 64, 132), 1);
  EXPECT_EQ(plan_tiled_split_k(64, 36, 9, 132), 4);  // SmolLM2 q_proj (576²): capped by 9 chunks / 2
}

TEST(CudaPartition, KvSplitsAreBoundedAndScaleWithLength) {
  EXPECT_EQ(plan_kv_splits(1, 9, 4096, 132), 16);  // the header's SmolLM2 figure
  EXPECT_EQ(plan_kv_splits(1, 9, 100, 132), 1);    // short context: no split
  EXPECT_EQ(plan_kv_splits(64, 32, 8192, 132), 1); // 2048 blocks already fill the GPU
  for (const int64_t rows : {1, 3, 16, 256}) {
    for (const int64_t heads : {1, 9, 32, 64}) {
      int64_t previous = 1;
      for (const int64_t len : {1, 255, 256, 257, 1000, 4096, 32768, 131072}) {
        const int64_t s = plan_kv_splits(rows, heads, len, 132);
        ASSERT_GE(s, 1);
        ASSERT_LE(s, kMaxKvSplits);
        EXPECT_GE(s, previous) << "more keys never get fewer splits";
        if (s > 1) {
          EXPECT_GE((len + s - 1) / s, kMinKeysPerSplit / 2) << rows << " " << heads << " " << len;
        }
        previous = s;
      }
    }
  }
}

TEST(CudaPartition, KeyRangesOfASplitCoverExactlyTheVisibleKeys) {
  for (const int64_t q_pos : {0, 1, 5, 255, 256, 1000, 4097}) {
    for (const int64_t window : {0, 1, 7, 256, 5000}) {
      for (const int64_t splits : {1, 2, 3, 7, 16, 32}) {
        SCOPED_TRACE(::testing::Message() << "q_pos " << q_pos << " window " << window << " splits " << splits);
        std::vector<int> hits(static_cast<size_t>(q_pos + 1), 0);
        int64_t prev_hi = -1;
        for (int64_t s = 0; s < splits; ++s) {
          const KeyRange r = split_key_range(q_pos, window, splits, s);
          ASSERT_GE(r.lo, 0);
          ASSERT_LE(r.hi, q_pos + 1);
          if (r.lo < r.hi) {
            if (prev_hi >= 0) {
              EXPECT_EQ(r.lo, prev_hi) << "ranges are contiguous, in split order";
            }
            prev_hi = r.hi;
          }
          for (int64_t p = r.lo; p < r.hi; ++p) ++hits[static_cast<size_t>(p)];
        }
        for (int64_t p = 0; p <= q_pos; ++p) {
          const bool visible = window == 0 || p > q_pos - window;
          ASSERT_EQ(hits[static_cast<size_t>(p)], visible ? 1 : 0) << "key " << p;
        }
      }
    }
  }
}

TEST(CudaGraphBuckets, SmallestBucketThatFitsOrNone) {
  const std::vector<int64_t> buckets = default_graph_buckets();
  ASSERT_TRUE(std::is_sorted(buckets.begin(), buckets.end()));
  EXPECT_EQ(graph_bucket(1, buckets), 1);
  EXPECT_EQ(graph_bucket(3, buckets), 4);
  EXPECT_EQ(graph_bucket(17, buckets), 24);
  EXPECT_EQ(graph_bucket(256, buckets), 256);
  EXPECT_EQ(graph_bucket(257, buckets), 0);
  for (int64_t rows = 1; rows <= 256; ++rows) {
    const int64_t b = graph_bucket(rows, buckets);
    ASSERT_GE(b, rows);
    EXPECT_LT(2 * (b - rows), b) << "padding waste of rows " << rows;  // under half of the bucket
  }
}

TEST(CudaGraphBuckets, StepGraphsValidatesBucketsAndRunsOversizedBatchesEagerly) {
  EXPECT_THROW(StepGraphs(std::vector<int64_t>{}), UsageError);
  EXPECT_THROW(StepGraphs(std::vector<int64_t>{1, 4, 4}), UsageError);
  EXPECT_THROW(StepGraphs(std::vector<int64_t>{0, 2}), UsageError);
  StepGraphs graphs(std::vector<int64_t>{2, 8});
  EXPECT_EQ(graphs.bucket_for(1), 2);
  EXPECT_EQ(graphs.bucket_for(8), 8);
  EXPECT_EQ(graphs.bucket_for(9), 0);
  // No bucket fits: the step runs directly with the real batch, no CUDA call is made (so this runs anywhere).
  std::vector<int64_t> calls;
  const auto ran = graphs.run(9, nullptr, [&](int64_t rows, cudaStream_t) { calls.push_back(rows); });
  EXPECT_EQ(ran, StepGraphs::Ran::Eager);
  EXPECT_EQ(calls, std::vector<int64_t>{9});
  EXPECT_EQ(graphs.graphs(), 0u);
  EXPECT_THROW(graphs.run(0, nullptr, [](int64_t, cudaStream_t) {}), UsageError);
}

}  // namespace
}  // namespace fp4serve::kernels::cuda
