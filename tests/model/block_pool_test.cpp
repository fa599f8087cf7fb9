// SPDX-License-Identifier: Apache-2.0
// The KV block pool and the paged KvCache's bookkeeping (model/block_pool.h, kv_cache.h): seeded random sequences
// of allocate / add_ref / release against a reference model of the reference counts (no leak, no double free,
// the free queue in LRU order), prefix registration and lookup with a hash that always collides (the tokens and
// the parent decide), eviction of a cached block and of its now unreachable children, and the cache's prefix
// matching, rewinds, sliding-window release, mirrored tables, and forks of a block table (n > 1 choices).
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "fp4serve/error.h"
#include "model/block_pool.h"
#include "model/kv_cache.h"

namespace fp4serve::model {
namespace {

uint64_t always_collides(uint64_t, std::span<const int32_t>) { return 42; }

TEST(BlockPool, RandomOperationsKeepReferenceCountsAndQueue) {
  for (const uint32_t seed : {1u, 2u, 3u}) {
    BlockPool pool(37, 4);
    std::mt19937 rng(seed);
    std::map<int32_t, int> refs;  // the reference model
    for (int step = 0; step < 4000; ++step) {
      const int op = static_cast<int>(rng() % 3);
      if (op == 0) {
        const int32_t b = pool.allocate();
        if (refs.size() == 37) {
          EXPECT_EQ(b, kNoBlock);
        } else {
          ASSERT_NE(b, kNoBlock);
          ASSERT_EQ(refs.count(b), 0u) << "allocated a referenced block";
          refs[b] = 1;
        }
      } else if (!refs.empty()) {
        auto it = refs.begin();
        std::advance(it, rng() % refs.size());
        if (op == 1) {
          pool.add_ref(it->first);
          ++it->second;
        } else {
          pool.release(it->first);
          if (--it->second == 0) refs.erase(it);
        }
      }
      ASSERT_EQ(pool.free_blocks(), 37 - static_cast<int64_t>(refs.size()));
      for (const auto& [b, n] : refs) ASSERT_EQ(pool.ref_count(b), n);
    }
    pool.check_invariants();
    for (auto& [b, n] : refs) {
      while (n-- > 0) pool.release(b);
    }
    EXPECT_EQ(pool.free_blocks(), 37);  // no leak
    pool.check_invariants();
  }
}

TEST(BlockPool, DoubleFreeAndBadBlocksAreRefused) {
  BlockPool pool(4, 2);
  const int32_t b = pool.allocate();
  pool.release(b);
  EXPECT_THROW(pool.release(b), UsageError);
  EXPECT_THROW(pool.add_ref(b), UsageError);  // free and uncached: its contents are garbage
  EXPECT_THROW(pool.release(9), UsageError);
  EXPECT_THROW(BlockPool(0, 16), UsageError);
}

TEST(BlockPool, FreedBlocksAreReusedLeastRecentlyUsedFirst) {
  BlockPool pool(3, 2);
  const int32_t a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  pool.release(b);
  pool.release(a);
  pool.release(c);
  EXPECT_EQ(pool.allocate(), b);
  EXPECT_EQ(pool.allocate(), a);
  EXPECT_EQ(pool.allocate(), c);
}

TEST(BlockPool, CollidingHashesAreResolvedByTokensAndParent) {
  BlockPool pool(8, 2, always_collides);
  const std::vector<int32_t> t1 = {1, 2}, t2 = {3, 4};
  const int32_t a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  const PrefixKey ka = pool.insert(kRootPrefix, t1, a);
  const PrefixKey kb = pool.insert(kRootPrefix, t2, b);  // same hash, other tokens: its own entry
  const PrefixKey kc = pool.insert(ka, t2, c);            // same tokens as b, other parent
  EXPECT_NE(ka, kb);
  EXPECT_NE(kb, kc);
  EXPECT_EQ(pool.lookup(kRootPrefix, t1)->block, a);
  EXPECT_EQ(pool.lookup(kRootPrefix, t2)->block, b);
  EXPECT_EQ(pool.lookup(ka, t2)->block, c);
  EXPECT_FALSE(pool.lookup(kb, t2).has_value());
  EXPECT_FALSE(pool.lookup(kRootPrefix, std::vector<int32_t>{1, 3}).has_value());
  // A second block with a registered prefix stays unregistered and gets the existing key.
  const int32_t d = pool.allocate();
  EXPECT_EQ(pool.insert(kRootPrefix, t1, d), ka);
  EXPECT_FALSE(pool.is_cached(d));
  pool.check_invariants();
}

TEST(BlockPool, EvictionMakesChildrenUnreachable) {
  BlockPool pool(2, 1);
  const std::vector<int32_t> x = {7}, y = {8};
  const int32_t a = pool.allocate(), b = pool.allocate();
  const PrefixKey ka = pool.insert(kRootPrefix, x, a);
  pool.insert(ka, y, b);
  pool.release(b);
  pool.release(a);  // queue: b, a
  ASSERT_TRUE(pool.lookup(ka, y).has_value());
  const int32_t reused = pool.allocate();  // evicts b (least recently used)
  EXPECT_EQ(reused, b);
  EXPECT_FALSE(pool.lookup(ka, y).has_value());
  // a is evicted next and re-registered with the same tokens: a new serial, so old children cannot match.
  pool.release(reused);
  const int32_t again = pool.allocate();
  const PrefixKey ka2 = pool.insert(kRootPrefix, x, again);
  EXPECT_NE(ka2.serial, ka.serial);
  pool.check_invariants();
}

std::vector<int32_t> tokens(int64_t n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + static_cast<int32_t>(i);
  return t;
}

// One class of windows (every layer full, or every layer sliding alike): one group of all layers.
KvGroupLayout uniform(int64_t layers) {
  return kv_group_layout(layers, KvCacheSpec{});
}

// explain's and serve's memory plan, worked out by hand. gpt-oss-20b: 24 layers alternating sliding (window 128)
// and full attention, 8 KV heads × 64: two groups of 12 layers; bf16 keys and values in blocks of 16 positions
// = 2 · 12 · 8 · 64 · 16 · 2 = 393,216 bytes a block; 4 GiB hold 10,922 blocks (4,294,967,296 / 393,216 =
// 10922.67), 174,752 positions of the full layers (one full group); a long sequence holds ⌈128 / 16⌉ + 1 = 9
// blocks of the sliding group besides. The same 24 layers all full: 786,432 bytes, 5,461 blocks, 87,376 positions.
// The default model (30 × 3 × 64, all full): 368,640 bytes, 11,650 blocks.
TEST(KvMemoryPlan, BlocksAndTokensFollowFromTheConfigAndBudget) {
  const int64_t gib4 = int64_t{4} << 30;
  KvCacheSpec gptoss_windows;
  for (int l = 0; l < 24; ++l) gptoss_windows.layer_windows.push_back(l % 2 == 0 ? 128 : 0);
  const KvMemoryPlan gptoss = kv_memory_plan(kv_group_layout(24, gptoss_windows), 8, 64, KvCacheDtype::Bf16, gib4);
  EXPECT_EQ(gptoss.groups, 2);
  EXPECT_EQ(gptoss.layers_per_block, 12);
  EXPECT_EQ(gptoss.bytes_per_block, 393216);
  EXPECT_EQ(gptoss.blocks, 10922);
  EXPECT_EQ(gptoss.tokens, 174752);
  EXPECT_EQ(gptoss.sliding_blocks_per_sequence, 9);
  EXPECT_EQ(gptoss.block_size, 16);
  EXPECT_EQ(gptoss.budget_bytes, gib4);
  EXPECT_LE(gptoss.pool_bytes(), gib4);
  EXPECT_GT(gptoss.pool_bytes() + gptoss.bytes_per_block, gib4);
  const KvMemoryPlan all_full = kv_memory_plan(uniform(24), 8, 64, KvCacheDtype::Bf16, gib4);
  EXPECT_EQ(all_full.bytes_per_block, 786432);
  EXPECT_EQ(all_full.blocks, 5461);
  EXPECT_EQ(all_full.tokens, 87376);
  EXPECT_EQ(all_full.sliding_blocks_per_sequence, 0);
  const KvMemoryPlan smol = kv_memory_plan(uniform(30), 3, 64, KvCacheDtype::Bf16, gib4);
  EXPECT_EQ(smol.bytes_per_block, 368640);
  EXPECT_EQ(smol.blocks, 11650);
  // fp32 doubles a block; a block of 32 positions too; a budget below one block holds none.
  EXPECT_EQ(kv_memory_plan(uniform(30), 3, 64, KvCacheDtype::F32, gib4).blocks, 5825);
  EXPECT_EQ(kv_memory_plan(uniform(30), 3, 64, KvCacheDtype::F16, gib4, 32).tokens, 5825 * 32);
  EXPECT_EQ(kv_memory_plan(uniform(30), 3, 64, KvCacheDtype::Bf16, 368639).blocks, 0);
  EXPECT_THROW(kv_memory_plan(KvGroupLayout{}, 3, 64, KvCacheDtype::Bf16, gib4), UsageError);
  EXPECT_THROW(kv_memory_plan(uniform(30), 3, 64, KvCacheDtype::Bf16, -1), UsageError);
  EXPECT_THROW(kv_memory_plan(uniform(30), 3, 64, KvCacheDtype::Bf16, gib4, 0), UsageError);
}

TEST(PagedKvCache, BlocksGrowWithTheSequenceAndReturnOnRelease) {
  KvCache cache(2, 1, 4, KvCacheSpec{64, 3, 10, 4});
  const int s = cache.acquire();
  cache.prepare(s, 0, 9);
  EXPECT_EQ(cache.block_table(s).size(), 3u);
  cache.commit(s, 0, tokens(9, 0));
  cache.prepare(s, 9, 1);
  EXPECT_EQ(cache.block_table(s).size(), 3u);  // position 9 fits block 2
  EXPECT_EQ(cache.free_blocks(), 7);
  EXPECT_FALSE(cache.reserve(s, 64));  // 16 blocks > the pool: nothing taken
  EXPECT_EQ(cache.free_blocks(), 7);
  const int other = cache.acquire();
  EXPECT_THROW(cache.prepare(other, 0, 40), UsageError);  // out of blocks
  cache.release(s);
  cache.release(other);
  EXPECT_EQ(cache.free_blocks(), 10);
  cache.pool().check_invariants();
}

TEST(PagedKvCache, PrefixMatchSharesFullBlocksAndStopsBeforeTheLastToken) {
  KvCache cache(1, 1, 4, KvCacheSpec{64, 4, 16, 4});
  cache.set_prefix_caching(true);
  const std::vector<int32_t> prompt = tokens(10, 100);
  const int a = cache.acquire();
  EXPECT_EQ(cache.match_prefix(a, prompt), 0);
  cache.prepare(a, 0, 10);
  cache.commit(a, 0, prompt);  // blocks 0 and 1 full: registered
  EXPECT_EQ(cache.pool().cached_blocks(), 2);
  const int b = cache.acquire();
  EXPECT_EQ(cache.match_prefix(b, prompt), 8);
  EXPECT_EQ(cache.block_table(b)[0], cache.block_table(a)[0]);
  EXPECT_EQ(cache.pool().ref_count(cache.block_table(a)[1]), 2);
  // The whole prompt cached: at most 7 of 8 positions are taken (the last token is computed).
  const int c = cache.acquire();
  EXPECT_EQ(cache.match_prefix(c, std::span(prompt).first(8)), 4);
  EXPECT_EQ(cache.prefix_cache_queries(), 28);
  EXPECT_EQ(cache.prefix_cache_hits(), 12);
  // A rewrite of a shared block is refused; after the sharers leave, it is taken out of the cache.
  EXPECT_THROW(cache.prepare(a, 2, 1), UsageError);
  cache.release(b);
  cache.release(c);
  cache.prepare(a, 6, 1);
  EXPECT_EQ(cache.pool().cached_blocks(), 1);
  cache.release(a);
  // Freed cached blocks stay findable until reused.
  const int d = cache.acquire();
  EXPECT_EQ(cache.match_prefix(d, prompt), 4);
  cache.release(d);
  cache.set_prefix_caching(false);
  EXPECT_EQ(cache.pool().cached_blocks(), 0);
  cache.pool().check_invariants();
}

TEST(PagedKvCache, SlidingWindowReleasesBlocksBehindIt) {
  KvCache cache(1, 1, 4, KvCacheSpec{100, 1, 30, 4, /*sliding_window=*/6});
  const int s = cache.acquire();
  cache.prepare(s, 0, 20);
  cache.commit(s, 0, tokens(20, 0));
  // The next position 20 reads 15 … 20: blocks 0 … 2 (positions 0 … 11) are released.
  const auto table = cache.block_table(s);
  EXPECT_EQ(std::count(table.begin(), table.end(), kNoBlock), 3);
  EXPECT_NE(table[3], kNoBlock);
  EXPECT_EQ(cache.free_blocks(), 30 - 2);
  EXPECT_THROW(cache.prepare(s, 8, 1), UsageError);  // rewinding into released blocks
  cache.prepare(s, 0, 4);                             // a restart from 0 drops everything first
  EXPECT_EQ(cache.block_table(s).size(), 1u);
  cache.release(s);
  EXPECT_EQ(cache.free_blocks(), 30);
}

TEST(PagedKvCache, MirroredTablesHoldNoReferences) {
  KvCache cache(1, 1, 4, KvCacheSpec{16, 2, 8, 4});
  const std::vector<int32_t> table = {5, 2};
  cache.assign_table(1, table);
  EXPECT_EQ(cache.free_blocks(), 8);
  EXPECT_NO_THROW(cache.prepare(1, 0, 8));
  EXPECT_THROW(cache.prepare(1, 0, 9), UsageError);  // past the assigned table
  EXPECT_THROW(cache.assign_table(0, std::vector<int32_t>{8}), UsageError);
  cache.release(1);
  EXPECT_EQ(cache.free_blocks(), 8);
}

// n > 1: a choice takes the leader's full prompt blocks by reference, with prefix caching off; only whole blocks
// whose tokens agree are shared, never the block holding the last prompt token; releasing either side keeps the
// other's blocks, releasing both returns every block.
TEST(PagedKvCache, ForkSharesFullBlocksWithoutThePrefixCache) {
  for (const bool caching : {false, true}) {
    SCOPED_TRACE(caching ? "prefix caching" : "no prefix caching");
    KvCache cache(1, 1, 4, KvCacheSpec{64, 4, 16, 4});
    cache.set_prefix_caching(caching);
    const std::vector<int32_t> prompt = tokens(10, 100);
    const int leader = cache.acquire();
    cache.prepare(leader, 0, 10);
    cache.commit(leader, 0, prompt);
    const int a = cache.acquire();
    EXPECT_EQ(cache.fork(leader, a, prompt), 8);  // blocks 0, 1; positions 8, 9 are computed by the choice
    EXPECT_EQ(cache.num_tokens(a), 8);
    EXPECT_EQ(cache.block_table(a)[1], cache.block_table(leader)[1]);
    EXPECT_EQ(cache.pool().ref_count(cache.block_table(leader)[0]), 2);
    EXPECT_EQ(cache.free_blocks(), 16 - 3);
    // The choice appends after the shared blocks: position 8 starts a block of its own.
    cache.prepare(a, 8, 2);
    cache.commit(a, 8, std::vector<int32_t>{108, 109});
    EXPECT_NE(cache.block_table(a)[2], cache.block_table(leader)[2]);
    // A prompt of exactly two blocks shares one (its last token is computed); one differing in block 1 shares one.
    const int b = cache.acquire();
    EXPECT_EQ(cache.fork(leader, b, std::span(prompt).first(8)), 4);
    std::vector<int32_t> other = prompt;
    other[5] = 7;
    const int c = cache.acquire();
    EXPECT_EQ(cache.fork(leader, c, other), 4);
    EXPECT_THROW(cache.fork(leader, c, prompt), UsageError);  // c already holds positions
    EXPECT_THROW(cache.fork(leader, leader, prompt), UsageError);
    EXPECT_EQ(cache.pool().ref_count(cache.block_table(leader)[0]), 4);
    cache.release(leader);
    EXPECT_EQ(cache.pool().ref_count(cache.block_table(a)[0]), 3);
    cache.release(b);
    cache.release(c);
    cache.release(a);
    EXPECT_EQ(cache.free_blocks(), 16);
    cache.pool().check_invariants();
  }
}

// A fork never hands over a block that a sliding window released but the choice's first position still reads.
TEST(PagedKvCache, ForkRefusesBlocksASlidingWindowReleased) {
  KvCache cache(1, 1, 4, KvCacheSpec{100, 3, 30, 4, /*sliding_window=*/6});
  const std::vector<int32_t> prompt = tokens(20, 0);
  const int leader = cache.acquire();
  cache.prepare(leader, 0, 20);
  cache.commit(leader, 0, prompt);  // blocks 0 … 2 released: position 16 reads 11 … 16, block 2 is gone
  const int a = cache.acquire();
  EXPECT_EQ(cache.fork(leader, a, prompt), 0);
  EXPECT_EQ(cache.num_tokens(a), 0);
  // A window the first computed position fits in: shares the blocks, the released ones as kNoBlock.
  KvCache wide(1, 1, 4, KvCacheSpec{100, 2, 30, 4, /*sliding_window=*/8});
  const std::vector<int32_t> odd = tokens(17, 0);
  const int l2 = wide.acquire();
  wide.prepare(l2, 0, 17);
  wide.commit(l2, 0, odd);  // position 17 reads 10 … 17: blocks 0, 1 released; the fork's position 16 reads 9 …
  const int b = wide.acquire();
  EXPECT_EQ(wide.fork(l2, b, odd), 16);
  EXPECT_EQ(wide.block_table(b)[1], kNoBlock);
  EXPECT_EQ(wide.block_table(b)[2], wide.block_table(l2)[2]);
  wide.prepare(b, 16, 1);
  wide.commit(b, 16, std::span(odd).subspan(16));
  cache.release(a);
  cache.release(leader);
  wide.release(b);
  wide.release(l2);
  EXPECT_EQ(cache.free_blocks(), 30);
  EXPECT_EQ(wide.free_blocks(), 30);
}

}  // namespace
}  // namespace fp4serve::model
