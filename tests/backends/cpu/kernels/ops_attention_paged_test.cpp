// SPDX-License-Identifier: Apache-2.0
// attention() over a paged KV cache (KvRows with a block table: model::KvCache's layout, blocks
// [block][kv_head][block position][head_dim] scattered over a pool in a random order) against a float64
// attention over the same positions laid out contiguously, on every SIMD target: decode, the blocked prefill
// from 0 and after a cached prefix, block sizes that are and are not multiples of the panel width, GQA ratios,
// sliding windows whose earlier blocks are released (table entry −1), sinks, bf16 / fp16 elements, and keys
// split across threads. Unused blocks and the padding of each row hold NaN, so reading a block the table does not
// name (or a released one) shows up as a NaN output.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>
#include <omp.h>

#include "backends/cpu/kernels/attention.h"
#include "backends/cpu/kernels/ops_test_util.h"
#include "fp4serve/error.h"
#include "quant/formats.h"

namespace fp4serve::kernels {
namespace paged_test {

using testing::for_each_simd_target;
using testing::random_nonzero;

struct PagedCase {
  int64_t heads, kv_heads, head_dim, t, start_pos, window, block_size;
  bool sinks = false;
  KvElement element = KvElement::F32;
};

void run_paged(const PagedCase& c) {
  SCOPED_TRACE(::testing::Message() << "H " << c.heads << " KVH " << c.kv_heads << " D " << c.head_dim << " t " << c.t
                                    << " start " << c.start_pos << " window " << c.window << " block " << c.block_size
                                    << " sinks " << c.sinks << " element " << kv_element_name(c.element));
  const int64_t H = c.heads, KVH = c.kv_heads, D = c.head_dim, bs = c.block_size;
  const int64_t filled = c.start_pos + c.t;
  const int64_t table_size = (filled + bs - 1) / bs;
  const int64_t num_blocks = 2 * table_size + 3;  // unused blocks stay NaN
  const int64_t row_stride = D + 2;               // padded rows: reading past D gives NaN
  const int64_t head_stride = bs * row_stride + 3;
  const int64_t block_stride = KVH * head_stride + 5;
  const uint32_t seed = uint32_t(H * 131 + D * 7 + c.t * 3 + c.start_pos + bs);
  std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(seed));
  std::vector<int32_t> table(blocks.begin(), blocks.begin() + table_size);
  // A sliding window releases the blocks wholly before the first query's window (KvCache::commit).
  const int64_t first_read = c.window > 0 ? std::max<int64_t>(0, c.start_pos - c.window + 1) : 0;
  for (int64_t b = 0; b < first_read / bs; ++b) table[static_cast<size_t>(b)] = -1;

  const std::vector<float> q = random_nonzero(c.t * H * D, seed, 0.05f, 1.5f);
  std::vector<float> k = random_nonzero(filled * KVH * D, seed + 1, 0.05f, 1.5f);
  std::vector<float> v = random_nonzero(filled * KVH * D, seed + 2);
  for (float& x : k) x = testing::kv_rounded(c.element, x);
  for (float& x : v) x = testing::kv_rounded(c.element, x);
  const int64_t elements = num_blocks * block_stride;
  const size_t words = static_cast<size_t>(elements * kv_element_bytes(c.element) / 2);
  std::vector<uint16_t> k_pool(words), v_pool(words);
  for (int64_t i = 0; i < elements; ++i) {
    testing::kv_store(k_pool, c.element, i, std::nanf(""));
    testing::kv_store(v_pool, c.element, i, std::nanf(""));
  }
  for (int64_t p = 0; p < filled; ++p) {
    const int32_t block = table[static_cast<size_t>(p / bs)];
    if (block < 0) continue;
    for (int64_t h = 0; h < KVH; ++h) {
      for (int64_t e = 0; e < D; ++e) {
        const int64_t at = block * block_stride + h * head_stride + (p % bs) * row_stride + e;
        testing::kv_store(k_pool, c.element, at, k[(p * KVH + h) * D + e]);
        testing::kv_store(v_pool, c.element, at, v[(p * KVH + h) * D + e]);
      }
    }
  }
  const std::vector<float> sinks = random_nonzero(H, seed + 3, 0.1f, 3.0f);
  const float scale = 1.0f / std::sqrt(float(D));
  // The same positions contiguous: k[(p · KVH + kvh) · D + e].
  const std::vector<double> ref = testing::attention_reference(q, k, v, c.kv_heads * c.head_dim, c.head_dim, c, scale, sinks);
  KvRows rows{k_pool.data(), v_pool.data(), row_stride, head_stride, c.element};
  rows.block_table = table.data();
  rows.block_table_size = table_size;
  rows.block_size = bs;
  rows.block_stride = block_stride;
  const AttentionParams params{H, KVH, D, scale, c.window, c.sinks ? sinks.data() : nullptr};
  for_each_simd_target([&] {
    std::vector<float> out(static_cast<size_t>(c.t * H * D), std::nanf(""));
    attention(q.data(), c.t, c.start_pos, rows, params, out.data());
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_NEAR(out[i], ref[i], 3e-6) << "element " << i << " (row " << i / (H * D) << ", head " << (i / D) % H
                                        << ")";
    }
  });
}

TEST(PagedAttention, DecodeAllGqaRatiosAndBlockSizes) {
  for (const int64_t bs : {16, 5, 1}) {
    for (const int64_t kvh : {1, 2, 4, 8}) run_paged({8, kvh, 64, 1, 37, 0, bs});
  }
}

TEST(PagedAttention, BlockedPrefillFromZeroAndAfterCachedPrefix) {
  for (const int64_t bs : {16, 7}) {
    run_paged({6, 2, 64, 19, 0, 0, bs});
    run_paged({6, 2, 64, 19, 48, 0, bs});  // a prefix-cache hit: 3 blocks of 16 cached, the rest computed
    run_paged({4, 4, 80, 33, 5, 0, bs});   // head_dim with a column tail
  }
}

TEST(PagedAttention, BlockedPrefillOverManyKeyTiles) {  // the flash-style prefill's tiles of 256 keys
  run_paged({9, 3, 64, 280, 0, 0, 16});                      // a prompt over two tiles in one call
  run_paged({6, 2, 64, 37, 600, 0, 7, true});                // a chunk after 600 cached keys, sinks
  run_paged({4, 2, 80, 45, 700, 300, 16, true, KvElement::Bf16});  // window over tiles, released blocks
}

TEST(PagedAttention, SlidingWindowWithReleasedBlocksAndSinks) {
  run_paged({4, 2, 64, 1, 200, 40, 16, true});    // decode: blocks before the window released
  run_paged({4, 2, 64, 24, 100, 40, 16, true});   // blocked prefill chunk past released blocks
  run_paged({4, 1, 32, 9, 61, 13, 5, false});     // window not a multiple of the block
}

TEST(PagedAttention, SixteenBitElements) {
  for (const KvElement el : {KvElement::Bf16, KvElement::F16}) {
    run_paged({8, 2, 64, 1, 300, 0, 16, false, el});
    run_paged({8, 2, 64, 17, 32, 0, 16, true, el});
    run_paged({4, 2, 64, 12, 90, 30, 16, false, el});
  }
}

TEST(PagedAttention, KeysSplitAcrossThreads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(8);
  run_paged({8, 1, 64, 1, 2000, 0, 16, true});  // one item: keys split into ranges across blocks, merged
  run_paged({8, 1, 64, 1, 700, 300, 16, false});
  omp_set_num_threads(saved);
}

TEST(PagedAttention, RejectsTablesThatDoNotCoverThePositions) {
  std::vector<float> buf(4096, 0.0f);
  std::vector<int32_t> table = {0, 1};
  KvRows rows{buf.data(), buf.data(), 4, 16, KvElement::F32};
  rows.block_table = table.data();
  rows.block_table_size = 2;
  rows.block_size = 4;
  rows.block_stride = 64;
  const AttentionParams params{2, 2, 4, 1.0f};
  std::vector<float> out(64);
  EXPECT_NO_THROW(attention(buf.data(), 1, 7, rows, params, out.data()));
  EXPECT_THROW(attention(buf.data(), 1, 8, rows, params, out.data()), UsageError);  // position 8: no third block
  table[0] = -1;
  EXPECT_THROW(attention(buf.data(), 1, 7, rows, params, out.data()), UsageError);  // a released block read
  const AttentionParams windowed{2, 2, 4, 1.0f, 4};
  EXPECT_NO_THROW(attention(buf.data(), 1, 7, rows, windowed, out.data()));  // the window never reads block 0
  rows.block_stride = 16;
  EXPECT_THROW(attention(buf.data(), 1, 7, rows, windowed, out.data()), UsageError);  // blocks overlap
}

}  // namespace paged_test
}  // namespace fp4serve::kernels
