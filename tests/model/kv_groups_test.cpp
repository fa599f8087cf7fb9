// SPDX-License-Identifier: Apache-2.0
// KV layer groups (kv_cache.h KvGroupLayout): layers of different attention windows keep their keys and values
// in blocks of their own, so a sliding layer's blocks return to the pool as its window passes them while the
// full-attention layers keep theirs (GPT-OSS alternates the two). The layout, the tables, prefix caching across
// groups, forks, tensor-parallel mirrors, and on the gpt-oss fixture: two sequences interleaved in a pool too small
// to hold them without those releases give the tokens and logits each gives alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <span>
#include <vector>

#include "backends/load_model.h"
#include "fp4serve/error.h"
#include "model/kv_cache.h"

namespace fp4serve::model {
namespace kv_groups {
namespace {

std::vector<int32_t> tokens(int64_t n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + static_cast<int32_t>(i);
  return t;
}

KvCacheSpec with_windows(std::vector<int64_t> windows, KvCacheSpec spec = {}) {
  spec.layer_windows = std::move(windows);
  return spec;
}

TEST(KvGroupLayout, LayersOfOneWindowShareAGroupAndClassesSplitEvenly) {
  const KvGroupLayout dense = kv_group_layout(30, KvCacheSpec{});
  EXPECT_EQ(dense.num_groups(), 1);
  EXPECT_EQ(dense.layers_per_block, 30);
  EXPECT_EQ(dense.row_of_layer[17], 17);
  EXPECT_EQ(kv_group_layout(4, KvCacheSpec{.sliding_window = 4096}).group_window, std::vector<int64_t>{4096});

  // GPT-OSS: even layers slide (128), odd layers attend to all; group 0 is the full one.
  std::vector<int64_t> alternating;
  for (int l = 0; l < 24; ++l) alternating.push_back(l % 2 == 0 ? 128 : 0);
  const KvGroupLayout gptoss = kv_group_layout(24, with_windows(alternating));
  EXPECT_EQ(gptoss.group_window, (std::vector<int64_t>{0, 128}));
  EXPECT_EQ(gptoss.layers_per_block, 12);
  EXPECT_EQ(gptoss.full_groups(), 1);
  EXPECT_EQ(gptoss.group_of_layer[0], 1);
  EXPECT_EQ(gptoss.row_of_layer[0], 0);
  EXPECT_EQ(gptoss.group_of_layer[5], 0);
  EXPECT_EQ(gptoss.row_of_layer[5], 2);
  EXPECT_EQ(gptoss.row_of_layer[23], 11);

  // Five sliding layers to one full one (24 layers: 20 + 4): groups of gcd(20, 4) = 4 layers, one full, five sliding.
  std::vector<int64_t> five_to_one;
  for (int l = 0; l < 24; ++l) five_to_one.push_back(l % 6 == 5 ? 0 : 512);
  const KvGroupLayout mixed = kv_group_layout(24, with_windows(five_to_one));
  EXPECT_EQ(mixed.layers_per_block, 4);
  EXPECT_EQ(mixed.group_window, (std::vector<int64_t>{0, 512, 512, 512, 512, 512}));
  std::vector<int> per_group(6, 0);
  for (int l = 0; l < 24; ++l) {
    ++per_group[static_cast<size_t>(mixed.group_of_layer[static_cast<size_t>(l)])];
    EXPECT_LT(mixed.row_of_layer[static_cast<size_t>(l)], 4);
  }
  EXPECT_EQ(per_group, std::vector<int>(6, 4));

  // Two windows and no full layer: the wider window leads.
  const KvGroupLayout two = kv_group_layout(3, with_windows({128, 4096, 128}));
  EXPECT_EQ(two.group_window, (std::vector<int64_t>{4096, 128, 128}));
  EXPECT_EQ(two.full_groups(), 0);
  // Sliding layers only, of two windows: a held position takes a block of each of the three groups.
  const KvMemoryPlan sliding_only = kv_memory_plan(two, 1, 4, KvCacheDtype::F32, 30 * 512);  // 2·1·4·16·4 bytes a block
  EXPECT_EQ(sliding_only.blocks, 30);
  EXPECT_EQ(sliding_only.tokens, 30 * 16 / 3);
  EXPECT_EQ(sliding_only.sliding_blocks_per_sequence, 0);

  EXPECT_THROW(kv_group_layout(3, with_windows({0, 128})), UsageError);
  EXPECT_THROW(kv_group_layout(2, with_windows({0, -1})), UsageError);
  EXPECT_THROW(kv_group_layout(0, KvCacheSpec{}), UsageError);
}

// Layer 0 slides (window 6), layer 1 attends to all; blocks of 4 positions.
KvCache hybrid(int slots, int64_t blocks) {
  return KvCache(2, 1, 4, with_windows({6, 0}, KvCacheSpec{100, slots, blocks, 4}));
}

TEST(KvGroups, SlidingGroupReleasesItsBlocksWhileTheFullGroupKeepsItsOwn) {
  KvCache cache = hybrid(1, 30);
  EXPECT_EQ(cache.num_groups(), 2);
  EXPECT_EQ(cache.layers_per_block(), 1);
  EXPECT_EQ(cache.group_of_layer(0), 1);
  EXPECT_EQ(cache.group_of_layer(1), 0);
  const int s = cache.acquire();
  EXPECT_EQ(cache.blocks_needed(s, 20), 10);  // 5 positions' blocks in each group
  cache.prepare(s, 0, 20);
  EXPECT_EQ(cache.free_blocks(), 20);
  cache.commit(s, 0, tokens(20, 0));
  // The next position 20 reads 15 … 20 in layer 0: its blocks 0 … 2 are released; layer 1 keeps all five.
  const auto sliding = cache.block_table(s, 1);
  const auto full = cache.block_table(s, 0);
  EXPECT_EQ(std::count(sliding.begin(), sliding.end(), kNoBlock), 3);
  EXPECT_EQ(std::count(full.begin(), full.end(), kNoBlock), 0);
  EXPECT_EQ(cache.free_blocks(), 30 - 5 - 2);
  // Growing by one block takes one in each group.
  cache.prepare(s, 20, 1);
  EXPECT_EQ(cache.free_blocks(), 30 - 6 - 3);
  cache.commit(s, 20, std::vector<int32_t>{20});
  EXPECT_EQ(cache.free_blocks(), 30 - 6 - 2);  // position 21 reads 16 … 21: layer 0's block 3 goes too
  EXPECT_THROW(cache.block_table(s, 2), UsageError);
  EXPECT_THROW(cache.prepare(s, 8, 1), UsageError);  // rewinding into released blocks
  cache.release(s);
  EXPECT_EQ(cache.free_blocks(), 30);
  cache.pool().check_invariants();
}

// Without groups the same sequence would hold every layer's block of all 60 positions (15 blocks of 2 layers);
// with them it holds layer 1's 15 and at most 3 of layer 0's: a pool of 20 serves it.
TEST(KvGroups, ALongSequenceFitsAPoolSizedForItsFullLayersAndWindow) {
  KvCache cache = hybrid(1, 20);
  const int s = cache.acquire();
  for (int64_t p = 0; p < 60; ++p) {
    cache.prepare(s, p, 1);
    cache.commit(s, p, std::vector<int32_t>{static_cast<int32_t>(p)});
  }
  EXPECT_LE(cache.num_blocks() - cache.free_blocks(), 15 + 3);
  cache.release(s);
  cache.pool().check_invariants();
}

TEST(KvGroups, PrefixHitTakesTheFullChainAndTheSlidingBlocksTheWindowReads) {
  KvCache cache = hybrid(2, 40);
  cache.set_prefix_caching(true);
  const std::vector<int32_t> prompt = tokens(20, 100);
  const int a = cache.acquire();
  cache.prepare(a, 0, 20);
  cache.commit(a, 0, prompt);
  const std::vector<int32_t> a_full(cache.block_table(a, 0).begin(), cache.block_table(a, 0).end());
  const std::vector<int32_t> a_sliding_tail(cache.block_table(a, 1).begin() + 3, cache.block_table(a, 1).end());
  cache.release(a);

  // 25 tokens whose first 20 are a's: position 20 reads keys 15 … 19 of layer 0, in blocks 3 and 4.
  std::vector<int32_t> longer = prompt;
  for (int32_t t = 0; t < 5; ++t) longer.push_back(900 + t);
  const int b = cache.acquire();
  EXPECT_EQ(cache.match_prefix(b, longer), 20);
  EXPECT_EQ(std::vector<int32_t>(cache.block_table(b, 0).begin(), cache.block_table(b, 0).end()), a_full);
  const auto sliding = cache.block_table(b, 1);
  ASSERT_EQ(sliding.size(), 5u);
  EXPECT_EQ(std::count(sliding.begin(), sliding.begin() + 3, kNoBlock), 3);
  EXPECT_EQ(std::vector<int32_t>(sliding.begin() + 3, sliding.end()), a_sliding_tail);
  EXPECT_EQ(cache.num_blocks() - cache.free_blocks(), 5 + 2);
  cache.prepare(b, 20, 5);
  cache.commit(b, 20, std::span(longer).subspan(20));
  cache.release(b);

  // A sliding block the window needs is gone (forgotten): the hit falls back to 16, where layer 0 reads blocks 2, 3.
  const int c = cache.acquire();
  cache.pool().check_invariants();
  const_cast<BlockPool&>(cache.pool()).forget(a_sliding_tail[1]);  // the pool is the cache's own member
  EXPECT_EQ(cache.match_prefix(c, longer), 16);
  EXPECT_EQ(cache.block_table(c, 1)[1], kNoBlock);
  EXPECT_NE(cache.block_table(c, 1)[2], kNoBlock);
  EXPECT_NE(cache.block_table(c, 1)[3], kNoBlock);
  cache.release(c);
  EXPECT_EQ(cache.free_blocks(), cache.num_blocks());
  cache.pool().check_invariants();
}

// Two full groups beside a sliding one (windows {0, 0, 6}): a full group needs every block of the hit, the
// sliding one only those its window reads; each group's missing block caps the hit on its own.
TEST(KvGroups, EveryFullGroupNeedsTheWholeHit) {
  KvCache cache(3, 1, 4, with_windows({0, 0, 6}, KvCacheSpec{100, 2, 60, 4}));
  ASSERT_EQ(cache.num_groups(), 3);
  cache.set_prefix_caching(true);
  const std::vector<int32_t> prompt = tokens(21, 50);
  const int a = cache.acquire();
  cache.prepare(a, 0, 21);
  cache.commit(a, 0, prompt);
  const std::vector<int32_t> second_full(cache.block_table(a, 1).begin(), cache.block_table(a, 1).end());
  cache.release(a);
  const int b = cache.acquire();
  EXPECT_EQ(cache.match_prefix(b, prompt), 20);
  cache.release(b);
  const_cast<BlockPool&>(cache.pool()).forget(second_full[3]);  // the second full group lacks block 3
  const int c = cache.acquire();
  EXPECT_EQ(cache.match_prefix(c, prompt), 12);
  cache.release(c);
  const_cast<BlockPool&>(cache.pool()).forget(second_full[0]);  // … and block 0: nothing is served
  const int d = cache.acquire();
  EXPECT_EQ(cache.match_prefix(d, prompt), 0);
  cache.release(d);
  EXPECT_EQ(cache.free_blocks(), 60);
  cache.pool().check_invariants();
}

TEST(KvGroups, ForkSharesEveryGroupsBlocksAndMirrorsCopyAllTables) {
  KvCache cache = hybrid(3, 40);
  const std::vector<int32_t> prompt = tokens(10, 7);
  const int leader = cache.acquire();
  cache.prepare(leader, 0, 10);
  cache.commit(leader, 0, prompt);  // position 10 reads 5 …: layer 0's block 0 released
  // A choice would compute from position 8, which reads keys 3 … of layer 0: block 0 is gone, so nothing is shared.
  const int choice = cache.acquire();
  EXPECT_EQ(cache.fork(leader, choice, prompt), 0);
  EXPECT_EQ(cache.num_tokens(choice), 0);
  cache.release(choice);

  KvCache wide(2, 1, 4, with_windows({8, 0}, KvCacheSpec{100, 2, 40, 4}));
  const int l = wide.acquire();
  wide.prepare(l, 0, 10);
  wide.commit(l, 0, prompt);  // position 10 reads 3 …: nothing released
  const int f = wide.acquire();
  EXPECT_EQ(wide.fork(l, f, prompt), 8);
  for (int g = 0; g < 2; ++g) {
    EXPECT_EQ(wide.block_table(f, g)[1], wide.block_table(l, g)[1]);
    EXPECT_EQ(wide.pool().ref_count(wide.block_table(l, g)[0]), 2);
  }
  // A tensor-parallel mirror takes both groups' tables at once.
  const std::vector<int32_t> all = wide.block_tables(l);
  ASSERT_EQ(all.size(), 6u);
  KvCache mirror(2, 1, 4, with_windows({8, 0}, KvCacheSpec{100, 2, 40, 4}));
  mirror.assign_table(0, all);
  EXPECT_EQ(mirror.block_tables(0), all);
  EXPECT_EQ(mirror.free_blocks(), 40);
  EXPECT_THROW(mirror.assign_table(1, std::span(all).first(5)), UsageError);  // not two tables of one length
  wide.release(f);
  wide.release(l);
  EXPECT_EQ(wide.free_blocks(), 40);
  cache.release(leader);
  EXPECT_EQ(cache.free_blocks(), 40);
}

// On the gpt-oss fixture (layer 0 slides over 128 positions with sinks, layer 1 attends to all): two sequences
// of 150-token prompts and 60 decode steps, interleaved one forward at a time, in a pool of 48 blocks of one layer.
// Each ends with 14 blocks of its full layer and holds at most 10 of its sliding one (9 in decode: a 128-position
// window spans 9 blocks of 16), 46 together at the peak, but allocates 28 over its run: 56 allocations from 48
// blocks, so the blocks the window released are handed to the other sequence and overwritten. A release too early
// (a block its window still reads) would change that sequence's keys. Each sequence's logits must be bit for bit
// those it gives alone in a roomy cache (one sequence per forward, so the kernels and their arithmetic are the same).
TEST(KvGroups, InterleavedSequencesInATightPoolMatchTheirSoloRuns) {
  namespace fs = std::filesystem;
  const LoadedModel loaded =
      load_model(fs::path(FP4SERVE_TEST_DATA) / "ref" / "gptoss-mxfp4-native", LoadOptions{});
  const ForwardModel& model = *loaded.decoder;
  constexpr int64_t kPrompt = 150, kDecode = 60, kBlocks = 48;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(loaded.config.vocab_size - 1));
  std::vector<std::vector<int32_t>> prompts(2, std::vector<int32_t>(kPrompt));
  for (auto& p : prompts) std::ranges::generate(p, [&] { return d(rng); });

  // Solo: each sequence alone, greedy, every step's logits kept.
  std::vector<std::vector<std::vector<float>>> solo(2);
  for (int i = 0; i < 2; ++i) {
    KvCache roomy = model.make_cache(kPrompt + kDecode + 1, 1);
    ASSERT_EQ(roomy.num_groups(), 2);
    const int slot = roomy.acquire();
    std::vector<int32_t> seq = prompts[static_cast<size_t>(i)];
    SequenceChunk chunk{slot, 0, seq, false};
    solo[static_cast<size_t>(i)].push_back(model.forward(std::span(&chunk, 1), roomy));
    for (int64_t step = 0; step < kDecode; ++step) {
      const auto& last = solo[static_cast<size_t>(i)].back();
      seq.push_back(static_cast<int32_t>(std::ranges::max_element(last) - last.begin()));
      SequenceChunk next{slot, static_cast<int64_t>(seq.size()) - 1, std::span(&seq.back(), 1), false};
      solo[static_cast<size_t>(i)].push_back(model.forward(std::span(&next, 1), roomy));
    }
  }

  KvCacheSpec tight{kPrompt + kDecode + 1, 2, kBlocks};
  KvCache cache = model.make_cache(tight);
  std::vector<std::vector<int32_t>> seqs = prompts;
  std::vector<int> slots = {cache.acquire(), cache.acquire()};
  int64_t peak = 0, allocated = 0;
  std::vector<size_t> held(2, 0);
  for (int64_t step = 0; step <= kDecode; ++step) {
    for (size_t i = 0; i < 2; ++i) {
      std::vector<float> logits;
      if (step == 0) {
        SequenceChunk chunk{slots[i], 0, seqs[i], false};
        logits = model.forward(std::span(&chunk, 1), cache);
      } else {
        SequenceChunk next{slots[i], static_cast<int64_t>(seqs[i].size()) - 1, std::span(&seqs[i].back(), 1), false};
        logits = model.forward(std::span(&next, 1), cache);
      }
      peak = std::max(peak, cache.num_blocks() - cache.free_blocks());
      size_t now = 0;  // blocks this sequence's tables ever held: entries that are or were blocks
      for (int g = 0; g < 2; ++g) now += cache.block_table(slots[i], g).size();
      allocated += static_cast<int64_t>(now - held[i]);
      held[i] = now;
      ASSERT_EQ(logits, solo[i][static_cast<size_t>(step)]) << "sequence " << i << ", step " << step;
      seqs[i].push_back(static_cast<int32_t>(std::ranges::max_element(logits) - logits.begin()));
    }
  }
  EXPECT_LE(peak, kBlocks);
  EXPECT_GT(allocated, kBlocks) << "no block was reused: the test does not exercise released blocks";
  for (const int s : slots) cache.release(s);
  EXPECT_EQ(cache.free_blocks(), cache.num_blocks());
  cache.pool().check_invariants();
}

}  // namespace
}  // namespace kv_groups
}  // namespace fp4serve::model
