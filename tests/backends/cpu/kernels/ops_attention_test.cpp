// SPDX-License-Identifier: Apache-2.0
// attention() against a float64 causal attention written here: GQA ratios 1 to 8; decode (t = 1 at
// start_pos 37 and at 3000); prefill t = 19 from 0 and a chunk from 23; the blocked prefill (t ≥
// kMinBlockedPrefillRows) over head dims with and without a column tail; sliding window; GPT-OSS sinks; key
// ranges split across threads and merged; the same shapes over bf16 and fp16 caches (the reference reads the
// values quant:: rounds them to, so only the kernels' widening and arithmetic are under test), and
// write_kv_row's vector rounding against quant::'s scalar one bit for bit.
// Cache rows past start_pos + t and the padding of each cache row hold NaN, so reading anything outside the
// causal window shows up as a NaN output.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include <gtest/gtest.h>
#include <omp.h>

#include "backends/cpu/kernels/attention.h"
#include "backends/cpu/kernels/ops_test_util.h"
#include "fp4serve/error.h"
#include "quant/formats.h"

namespace fp4serve::kernels {
namespace {

using testing::for_each_simd_target;
using testing::poisoned;
using testing::random_nonzero;

struct Case {
  int64_t heads, kv_heads, head_dim, t, start_pos, window;
  bool sinks;
  KvElement element = KvElement::F32;
  bool head_major = false;  // [KVH][positions][D] (model::KvCache) instead of [positions][KVH · D]
};

// The cache rows in `element` bits (NaN stays NaN: the poison).
std::vector<uint16_t> as_cache(const std::vector<float>& x, KvElement element) {
  std::vector<uint16_t> out(x.size() * static_cast<size_t>(kv_element_bytes(element)) / 2);
  for (size_t i = 0; i < x.size(); ++i) testing::kv_store(out, element, static_cast<int64_t>(i), x[i]);
  return out;
}

void run_case(const Case& c) {
  SCOPED_TRACE(::testing::Message() << "H " << c.heads << " KVH " << c.kv_heads << " D " << c.head_dim << " t " << c.t
                                    << " start " << c.start_pos << " window " << c.window << " sinks " << c.sinks
                                    << " element " << kv_element_name(c.element) << " head-major " << c.head_major);
  const int64_t H = c.heads, KVH = c.kv_heads, D = c.head_dim;
  const int64_t filled = c.start_pos + c.t;
  const int64_t cache_rows = filled + 4;  // rows beyond the sequence must never be read
  // Padded rows (and padded head blocks): reading outside a head's D elements or past its positions gives NaN.
  const int64_t row_stride = c.head_major ? D + 3 : KVH * D + 5;
  const int64_t head_stride = c.head_major ? cache_rows * row_stride + 7 : D;
  const int64_t size = c.head_major ? KVH * head_stride : cache_rows * row_stride;
  const uint32_t seed = uint32_t(H * 131 + D * 7 + c.t * 3 + c.start_pos);
  // Keys scaled up so the softmax is peaked and the max-shift matters.
  std::vector<float> q = random_nonzero(c.t * H * D, seed, 0.05f, 1.5f);
  std::vector<float> k = poisoned(size), v = poisoned(size);
  const std::vector<float> kr = random_nonzero(filled * KVH * D, seed + 1, 0.05f, 1.5f);
  const std::vector<float> vr = random_nonzero(filled * KVH * D, seed + 2);
  for (int64_t p = 0; p < filled; ++p) {
    for (int64_t h = 0; h < KVH; ++h) {
      for (int64_t e = 0; e < D; ++e) {
        const int64_t at = p * row_stride + h * head_stride + e, from = (p * KVH + h) * D + e;
        k[at] = testing::kv_rounded(c.element, kr[from]);
        v[at] = testing::kv_rounded(c.element, vr[from]);
      }
    }
  }
  const std::vector<uint16_t> k_cache = as_cache(k, c.element), v_cache = as_cache(v, c.element);
  const std::vector<float> sinks = random_nonzero(H, seed + 3, 0.1f, 3.0f);
  const float scale = 1.0f / std::sqrt(float(D));
  const std::vector<double> ref = testing::attention_reference(q, k, v, row_stride, head_stride, c, scale, sinks);
  AttentionParams params{H, KVH, D, scale, c.window, c.sinks ? sinks.data() : nullptr};
  for_each_simd_target([&] {
    std::vector<float> out = poisoned(c.t * H * D);
    attention(q.data(), c.t, c.start_pos, KvRows{k_cache.data(), v_cache.data(), row_stride, head_stride, c.element},
              params, out.data());
    for (size_t i = 0; i < out.size(); ++i) {
      // |v| ≤ 1 and the weights sum to ≤ 1: fp32 scores/exp/accumulation give ~1e-6 absolute error.
      ASSERT_NEAR(out[i], ref[i], 3e-6) << "element " << i << " (row " << i / (H * D) << ", head "
                                        << (i / D) % H << ")";
    }
  });
}

TEST(Attention, DecodeAtPosition37AllGqaRatios) {
  for (auto [H, KVH] : {std::pair{3, 3}, std::pair{6, 2}, std::pair{8, 2}}) run_case({H, KVH, 24, 1, 37, 0, false});
}

// Decode's value sum runs on the GEMM micro-kernel in blocks of keys: head dims with and without a column tail,
// a group larger than the micro-kernel's rows (16 heads on one KV head), more keys than one block.
TEST(Attention, DecodeHeadDimsAndLargeGroups) {
  for (int64_t D : {64, 80, 128}) run_case({9, 3, D, 1, 200, 0, false});
  run_case({16, 1, 64, 1, 150, 0, true});
}

TEST(Attention, PrefillNineteenAllGqaRatios) {
  for (auto [H, KVH] : {std::pair{3, 3}, std::pair{6, 2}, std::pair{8, 2}}) run_case({H, KVH, 13, 19, 0, 0, false});
}

TEST(Attention, ChunkedPrefillAfterCachedPrefix) { run_case({6, 2, 64, 19, 23, 0, false}); }

// From kMinBlockedPrefillRows rows attention() runs blocked (query rows × heads as matrices on the GEMM
// micro-kernel). Head dims 64 and 128 (whole panels on every target), 80 and 20 (a column tail past the last
// panel on AVX-512 / AVX2), GQA groups 1 to 8 (rows per block 12 to 1), prompts longer than a key panel.
TEST(Attention, BlockedPrefillAllGqaRatiosAndHeadDims) {
  for (auto [H, KVH] : {std::pair{4, 4}, std::pair{9, 3}, std::pair{8, 1}}) {
    for (int64_t D : {64, 128, 80, 20}) run_case({H, KVH, D, 77, 0, 0, false});
  }
}

TEST(Attention, BlockedPrefillChunkAfterCachedPrefixWindowAndSinks) {
  run_case({9, 3, 64, 16, 300, 0, false});  // a short chunk after many cached keys
  run_case({8, 2, 64, 61, 40, 0, true});
  run_case({6, 2, 64, 70, 13, 37, true});   // window shorter than the chunk, sinks
  run_case({9, 3, 80, 45, 0, 100, false});  // window longer than the sequence
  run_case({9, 3, 64, 40, 300, 50, true});  // the first row's window starts past many key panels
}

// Prompts over several key tiles of the flash-style prefill (attention_prefill.cpp kKeyTile = 256 keys): each
// row's running max and sum are rescaled when a later tile holds a larger score.
TEST(Attention, BlockedPrefillOverManyKeyTiles) {
  run_case({9, 3, 64, 300, 0, 0, false});   // rows from 1 to 300 keys: one and two tiles
  run_case({8, 2, 80, 64, 700, 0, true});   // a chunk after 700 cached keys, column tail, sinks
  run_case({6, 3, 72, 50, 900, 333, true}); // a window over tile boundaries
  run_case({5, 5, 40, 33, 1100, 0, false}); // MHA, odd head_dim
}

// Eight threads on few rows: fewer rows per block, so that every thread has a block.
TEST(Attention, BlockedPrefillManyThreads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(8);
  run_case({9, 3, 64, 17, 5, 0, false});
  run_case({8, 1, 128, 33, 0, 9, true});
  omp_set_num_threads(saved);
}

TEST(Attention, TwoRowsAfterCachedPrefix) { run_case({9, 3, 64, 2, 300, 0, true}); }

TEST(Attention, SlidingWindow) {
  run_case({8, 2, 20, 19, 0, 7, false});   // window shorter than the prefill
  run_case({6, 2, 20, 1, 37, 7, false});   // decode: only the last 7 positions
  run_case({3, 3, 20, 5, 10, 64, false});  // window longer than the sequence = full causal
}

TEST(Attention, SinksInDenominatorOnly) {
  run_case({8, 2, 64, 1, 37, 0, true});
  run_case({6, 2, 17, 19, 0, 5, true});  // GPT-OSS sliding layers combine both
}

TEST(Attention, LongDecode) { run_case({8, 2, 64, 1, 3000, 0, true}); }

// With more threads than (row, KV head) items the keys are split into ranges and merged (flash-decoding). Eight
// OpenMP threads whatever the machine, so the merge runs on every machine; each case checks that it splits.
TEST(Attention, KeyRangesSplitAcrossThreadsMergeExactly) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(8);
  const Case cases[] = {
      {3, 1, 24, 1, 300, 0, false},  // one KV head: 4 ranges of ~75 keys
      {8, 2, 64, 1, 1000, 0, true},  // sinks merged once, not per range
      {6, 2, 20, 1, 999, 200, true},  // sliding window: 3 ranges of the last 200 keys
      {3, 1, 16, 3, 257, 0, false},  // three rows of different lengths, ranges cut per row
  };
  for (const Case& c : cases) {
    const int64_t keys = c.window > 0 ? c.window : c.start_pos + c.t;
    EXPECT_GT(attention_key_splits(c.t, c.kv_heads, keys, 8), 1);
    run_case(c);
  }
  omp_set_num_threads(saved);
}

// 16-bit caches: decode row by row (one and several chunks of widened keys, head dims with a vector tail and
// below one vector), split key ranges, the blocked prefill (widened keys packed, values widened per call), and
// windows with sinks.
TEST(Attention, SixteenBitCaches) {
  const int saved = omp_get_max_threads();
  for (KvElement element : {KvElement::Bf16, KvElement::F16}) {
    omp_set_num_threads(1);
    run_case({9, 3, 64, 1, 500, 0, false, element, true});  // model::KvCache's layout
    run_case({8, 2, 80, 33, 40, 0, true, element, true});
    run_case({9, 3, 64, 40, 300, 50, true, element, true});  // prefill window past the first key panels
    run_case({9, 3, 64, 1, 37, 0, false, element});
    run_case({8, 2, 64, 1, 700, 0, true, element});    // 11 chunks of 64 keys
    run_case({6, 2, 20, 1, 150, 0, false, element});   // D = 20: 16 lanes + a scalar tail (AVX-512)
    run_case({3, 3, 8, 1, 90, 0, false, element});     // D = 8: scalar widening on AVX-512
    run_case({9, 3, 80, 1, 300, 0, false, element});   // chunk of 48 keys
    run_case({16, 1, 128, 1, 77, 0, true, element});
    run_case({6, 2, 20, 1, 37, 7, false, element});    // decode in a window
    run_case({9, 3, 64, 77, 0, 0, false, element});    // blocked prefill
    run_case({8, 2, 80, 61, 40, 0, true, element});    // a chunk after cached keys, column tail
    run_case({6, 2, 64, 70, 13, 37, true, element});   // window and sinks
    omp_set_num_threads(8);
    run_case({3, 1, 24, 1, 300, 0, false, element});   // key ranges split and merged
    run_case({8, 2, 64, 1, 1000, 0, true, element, true});
    run_case({9, 3, 64, 17, 5, 0, false, element});    // blocked prefill on many threads
  }
  omp_set_num_threads(saved);
}

// The vector rounding (bf16 by integer arithmetic, fp16 by F16C where present) agrees bit for bit with quant::'s
// scalar one (a NaN stays a NaN of the same sign; its payload is not compared): random magnitudes over the whole
// range, exact halfway ties both ways, subnormals, values that round to ±inf (fp16 above 65504), ±0, ±inf and NaN,
// in lengths with and without a vector tail.
TEST(Attention, WriteKvRowRoundsLikeQuant) {
  std::vector<float> x = random_nonzero(1000, 17, 1e-3f, 1.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] *= std::ldexp(1.0f, static_cast<int>(i % 61) - 30);
    if (i % 3 == 0) x[i] = -x[i];
  }
  for (uint32_t m : {0x3F808000u, 0x3F818000u, 0x3F800001u, 0xBF808000u, 0x3F801000u, 0x3F803000u}) {
    x.push_back(std::bit_cast<float>(m));  // bf16 ties (…8000) to even and odd, fp16 ties (…1000 / …3000)
  }
  for (float s : {0.0f, -0.0f, 1e-40f, -3e-39f, 6e-8f, 3e-5f, 65504.0f, 65519.0f, 65520.0f, -70000.0f, 3.4e38f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()}) {
    x.push_back(s);
  }
  for (KvElement element : {KvElement::Bf16, KvElement::F16}) {
    for (size_t n : {x.size(), size_t{13}, size_t{16}}) {
      const std::vector<float> part(x.end() - static_cast<std::ptrdiff_t>(n), x.end());
      for_each_simd_target([&] {
        std::vector<uint16_t> got(n + 8, 0xAAAA);  // 8 guards: nothing is written past n
        write_kv_row(part.data(), static_cast<int64_t>(n), element, got.data());
        for (size_t i = n; i < n + 8; ++i) ASSERT_EQ(got[i], 0xAAAA) << "written past the row, element " << i;
        for (size_t i = 0; i < n; ++i) {
          const uint16_t want = element == KvElement::Bf16 ? quant::float_to_bf16(part[i]) : quant::float_to_f16(part[i]);
          if (std::isnan(part[i])) {
            const float back = element == KvElement::Bf16 ? quant::bf16_to_float(got[i]) : quant::f16_to_float(got[i]);
            EXPECT_TRUE(std::isnan(back)) << kv_element_name(element) << " element " << i;
            EXPECT_EQ(got[i] & 0x8000, want & 0x8000) << "NaN sign, element " << i;
          } else {
            ASSERT_EQ(got[i], want) << kv_element_name(element) << " element " << i << " = " << part[i];
          }
        }
      });
    }
  }
  std::vector<float> copy(5);
  const float src[5] = {1.5f, -2.25f, 3e-39f, 7.0f, -0.0f};
  write_kv_row(src, 5, KvElement::F32, copy.data());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(copy[i]), std::bit_cast<uint32_t>(src[i]));
}

// model::KvCache's layout, [KVH][positions][D] (head blocks padded too), through every path: decode row by row,
// split key ranges, the blocked prefill with a window and sinks.
TEST(Attention, HeadMajorCache) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  run_case({9, 3, 64, 1, 300, 0, false, KvElement::F32, true});
  run_case({8, 2, 20, 1, 37, 7, true, KvElement::F32, true});
  run_case({9, 3, 80, 45, 0, 0, false, KvElement::F32, true});
  run_case({6, 2, 64, 70, 13, 37, true, KvElement::F32, true});
  omp_set_num_threads(8);
  run_case({8, 2, 64, 1, 1000, 0, true, KvElement::F32, true});
  run_case({9, 3, 64, 17, 5, 0, false, KvElement::F32, true});
  omp_set_num_threads(saved);
}

TEST(Attention, KeySplitsOnlyWhenThreadsOutnumberItems) {
  EXPECT_EQ(attention_key_splits(1, 3, 4096, 1), 1);       // one thread
  EXPECT_EQ(attention_key_splits(1, 8, 4096, 4), 1);       // 8 items ≥ 2·4
  EXPECT_EQ(attention_key_splits(1, 3, 4096, 2), 2);       // 3 items < 4: ⌈4/3⌉
  EXPECT_EQ(attention_key_splits(1, 2, 4096, 16), 16);     // ⌈32/2⌉
  EXPECT_EQ(attention_key_splits(1, 2, 3 * kMinKeysPerSplit, 16), 3);  // ranges keep ≥ kMinKeysPerSplit keys
  EXPECT_EQ(attention_key_splits(1, 1, kMinKeysPerSplit - 1, 8), 1);
}

TEST(Attention, SinkOnlyRowShrinksOutput) {
  // One key with logit 0 and a sink of ln 3: weight 1/(1 + 3) = 0.25 on v.
  const float q[2] = {0.0f, 0.0f}, k[2] = {0.3f, -0.2f}, v[2] = {2.0f, -4.0f}, sink = std::log(3.0f);
  float out[2];
  attention(q, 1, 0, k, v, 2, AttentionParams{1, 1, 2, 1.0f, 0, &sink}, out);
  EXPECT_NEAR(out[0], 0.5f, 1e-6f);
  EXPECT_NEAR(out[1], -1.0f, 1e-6f);
}

TEST(Attention, RejectsBadShapes) {
  float buf[64] = {};
  EXPECT_THROW(attention(buf, 1, 0, buf, buf, 8, AttentionParams{6, 4, 2, 1.0f}, buf), UsageError);
  EXPECT_THROW(attention(buf, 1, 0, buf, buf, 3, AttentionParams{2, 2, 2, 1.0f}, buf), UsageError);
  EXPECT_THROW(attention(buf, 1, -1, buf, buf, 4, AttentionParams{2, 2, 2, 1.0f}, buf), UsageError);
  EXPECT_THROW(attention(nullptr, 1, 0, buf, buf, 4, AttentionParams{2, 2, 2, 1.0f}, buf), UsageError);
  // Head blocks that overlap the next head's positions: 3 positions of row stride 2 need a head stride ≥ 6.
  EXPECT_THROW(attention(buf, 1, 2, KvRows{buf, buf, 2, 5}, AttentionParams{2, 2, 2, 1.0f}, buf), UsageError);
  EXPECT_NO_THROW(attention(buf, 1, 2, KvRows{buf, buf, 2, 6}, AttentionParams{2, 2, 2, 1.0f}, buf + 32));
}

}  // namespace
}  // namespace fp4serve::kernels
