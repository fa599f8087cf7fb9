// SPDX-License-Identifier: Apache-2.0
// decode_attention() (attention.h): one decode row per sequence, each with its own position and block table in one
// shared paged pool (blocks shuffled, unused ones and each row's padding NaN), against the float64 reference per
// sequence on every SIMD target, and against attention() run on each sequence alone: bit for bit where both split
// the keys alike (one thread; batch-invariant mode), within fp32 rounding where the batch splits them otherwise.
// Odd shapes: head_dim 40 and 72, GQA 1 / 3 / 5, block sizes 16 and 7, sliding windows with released blocks,
// sinks, bf16 elements, sequences of 1 to 900 keys.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>
#include <omp.h>

#include "backends/cpu/kernels/attention.h"
#include "backends/cpu/kernels/batch_invariant.h"
#include "backends/cpu/kernels/ops_test_util.h"
#include "fp4serve/error.h"
#include "quant/formats.h"

namespace fp4serve::kernels {
namespace batched_test {

using testing::for_each_simd_target;
using testing::random_nonzero;

struct Shape {
  int64_t heads, kv_heads, head_dim, window, block_size;
  bool sinks = false;
  KvElement element = KvElement::F32;
};

// One sequence's view for attention_reference (a decode row: t = 1 at start_pos).
struct RefCase {
  int64_t heads, kv_heads, head_dim, t, start_pos, window;
  bool sinks;
};

// Sequences of the given positions in one pool: keys/values contiguous per sequence for the reference, and the
// paged rows each sequence's DecodeQuery reads.
struct Batch {
  Shape s;
  std::vector<int64_t> positions;
  std::vector<std::vector<float>> k, v;  // per sequence [pos + 1][KVH][D]
  std::vector<std::vector<int32_t>> tables;
  std::vector<uint16_t> k_pool, v_pool;
  std::vector<float> q, sinks;
  int64_t row_stride = 0, head_stride = 0, block_stride = 0;

  Batch(const Shape& shape, std::vector<int64_t> pos, uint32_t seed) : s(shape), positions(std::move(pos)) {
    const int64_t KVH = s.kv_heads, D = s.head_dim, bs = s.block_size;
    row_stride = D + 1;
    head_stride = bs * row_stride + 2;
    block_stride = KVH * head_stride + 3;
    int64_t total_blocks = 0;
    for (const int64_t p : positions) total_blocks += p / bs + 1;
    const int64_t num_blocks = total_blocks + 4;  // unused blocks stay NaN
    std::vector<int32_t> order(static_cast<size_t>(num_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(seed));
    const int64_t elements = num_blocks * block_stride;
    const size_t words = static_cast<size_t>(elements * kv_element_bytes(s.element) / 2);
    k_pool.assign(words, 0);
    v_pool.assign(words, 0);
    for (int64_t i = 0; i < elements; ++i) {
      store(k_pool, i, std::nanf(""));
      store(v_pool, i, std::nanf(""));
    }
    size_t next = 0;
    for (size_t r = 0; r < positions.size(); ++r) {
      const int64_t filled = positions[r] + 1;
      std::vector<int32_t> table(order.begin() + static_cast<int64_t>(next),
                                 order.begin() + static_cast<int64_t>(next) + (filled + bs - 1) / bs);
      next += table.size();
      const int64_t first_read = s.window > 0 ? std::max<int64_t>(0, positions[r] - s.window + 1) : 0;
      for (int64_t b = 0; b < first_read / bs; ++b) table[static_cast<size_t>(b)] = -1;  // released
      std::vector<float> kr = random_nonzero(filled * KVH * D, seed + 10 * uint32_t(r) + 1, 0.05f, 1.5f);
      std::vector<float> vr = random_nonzero(filled * KVH * D, seed + 10 * uint32_t(r) + 2);
      for (float& x : kr) x = testing::kv_rounded(s.element, x);
      for (float& x : vr) x = testing::kv_rounded(s.element, x);
      for (int64_t p = 0; p < filled; ++p) {
        const int32_t block = table[static_cast<size_t>(p / bs)];
        if (block < 0) continue;
        for (int64_t h = 0; h < KVH; ++h) {
          for (int64_t e = 0; e < D; ++e) {
            const int64_t at = block * block_stride + h * head_stride + (p % bs) * row_stride + e;
            store(k_pool, at, kr[(p * KVH + h) * D + e]);
            store(v_pool, at, vr[(p * KVH + h) * D + e]);
          }
        }
      }
      k.push_back(std::move(kr));
      v.push_back(std::move(vr));
      tables.push_back(std::move(table));
    }
    q = random_nonzero(positions.size() * s.heads * D, seed + 7, 0.05f, 1.5f);
    sinks = random_nonzero(s.heads, seed + 8, 0.1f, 3.0f);
  }

  void store(std::vector<uint16_t>& pool, int64_t at, float x) const { testing::kv_store(pool, s.element, at, x); }
  int64_t width() const { return s.heads * s.head_dim; }
  float scale() const { return 1.0f / std::sqrt(float(s.head_dim)); }
  AttentionParams params() const {
    return {s.heads, s.kv_heads, s.head_dim, scale(), s.window, s.sinks ? sinks.data() : nullptr};
  }
  KvRows rows(size_t r) const {
    KvRows kv{k_pool.data(), v_pool.data(), row_stride, head_stride, s.element};
    kv.block_table = tables[r].data();
    kv.block_table_size = static_cast<int64_t>(tables[r].size());
    kv.block_size = s.block_size;
    kv.block_stride = block_stride;
    return kv;
  }
  std::vector<DecodeQuery> queries(std::vector<float>& out) const {
    std::vector<DecodeQuery> qs;
    for (size_t r = 0; r < positions.size(); ++r) {
      const auto off = static_cast<int64_t>(r) * width();
      qs.push_back({q.data() + off, positions[r], rows(r), out.data() + off});
    }
    return qs;
  }
  std::vector<float> batched() const {
    std::vector<float> out(positions.size() * static_cast<size_t>(width()), std::nanf(""));
    decode_attention(queries(out), params());
    return out;
  }
  std::vector<float> one_by_one() const {
    std::vector<float> out(positions.size() * static_cast<size_t>(width()), std::nanf(""));
    for (size_t r = 0; r < positions.size(); ++r) {
      const auto off = static_cast<int64_t>(r) * width();
      attention(q.data() + off, 1, positions[r], rows(r), params(), out.data() + off);
    }
    return out;
  }
  void expect_near_reference(const std::vector<float>& out) const {
    for (size_t r = 0; r < positions.size(); ++r) {
      const RefCase c{s.heads, s.kv_heads, s.head_dim, 1, positions[r], s.window, s.sinks};
      const std::vector<float> qr(q.begin() + static_cast<int64_t>(r) * width(),
                                  q.begin() + static_cast<int64_t>(r + 1) * width());
      const std::vector<double> ref =
          testing::attention_reference(qr, k[r], v[r], s.kv_heads * s.head_dim, s.head_dim, c, scale(), sinks);
      for (int64_t i = 0; i < width(); ++i) {
        ASSERT_NEAR(out[static_cast<size_t>(static_cast<int64_t>(r) * width() + i)], ref[static_cast<size_t>(i)], 3e-6)
            << "sequence " << r << " at position " << positions[r] << ", head " << i / s.head_dim;
      }
    }
  }
};

struct ThreadCount {
  explicit ThreadCount(int n) : saved(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(saved); }
  int saved;
};

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> all = {
      {9, 3, 64, 0, 16},                          // the default model's attention
      {15, 5, 40, 0, 7},                          // odd head_dim, block size 7
      {6, 6, 72, 0, 16, true},                    // MHA, head_dim 72, sinks
      {8, 2, 64, 50, 16, true},                   // sliding window: early blocks released
      {9, 3, 64, 0, 16, false, KvElement::Bf16},  // bf16 cache
  };
  return all;
}

const std::vector<int64_t> kPositions = {0, 900, 17, 255, 3, 128, 64, 499, 33};

TEST(BatchedDecodeAttention, MatchesFloat64ReferenceOnEveryTargetAndThreadCount) {
  uint32_t seed = 100;
  for (const Shape& s : shapes()) {
    SCOPED_TRACE(::testing::Message() << "H " << s.heads << " KVH " << s.kv_heads << " D " << s.head_dim << " window "
                                      << s.window << " block " << s.block_size << " sinks " << s.sinks);
    const Batch b(s, kPositions, seed++);
    for (const int threads : {1, 3, 16}) {  // 16 threads: few (row, KV head) items, keys split across ranges
      SCOPED_TRACE(::testing::Message() << threads << " threads");
      const ThreadCount tc(threads);
      for_each_simd_target([&] { b.expect_near_reference(b.batched()); });
    }
  }
}

TEST(BatchedDecodeAttention, OneRowAndFewRowsSplitTheirKeys) {
  const ThreadCount tc(8);
  const Batch one({8, 1, 64, 0, 16, true}, {1999}, 7);  // one item: split into 16 ranges as attention() does
  for_each_simd_target([&] {
    const std::vector<float> out = one.batched();
    one.expect_near_reference(out);
    EXPECT_EQ(0, std::memcmp(out.data(), one.one_by_one().data(), out.size() * sizeof(float)))
        << "a batch of one row is attention() of that row";
  });
  const Batch two({4, 2, 48, 300, 5}, {700, 2}, 8);  // a short row among long ones: some ranges empty
  for_each_simd_target([&] { two.expect_near_reference(two.batched()); });
}

TEST(BatchedDecodeAttention, EqualsSingleSequenceKernelBitForBit) {
  for (const Shape& s : shapes()) {
    const Batch b(s, kPositions, 31);
    {
      const ThreadCount tc(1);  // no key split either way
      for_each_simd_target([&] {
        const std::vector<float> batched = b.batched(), alone = b.one_by_one();
        EXPECT_EQ(0, std::memcmp(batched.data(), alone.data(), batched.size() * sizeof(float)));
      });
    }
    const ThreadCount tc(4);
    set_batch_invariant(true);  // neither splits, whatever the threads
    const std::vector<float> batched = b.batched(), alone = b.one_by_one();
    set_batch_invariant(false);
    EXPECT_EQ(0, std::memcmp(batched.data(), alone.data(), batched.size() * sizeof(float)));
    // Without batch invariance alone splits keys (3 items < 8) and the batch does not: fp32 rounding apart.
    const std::vector<float> split_batched = b.batched(), split_alone = b.one_by_one();
    for (size_t i = 0; i < split_batched.size(); ++i) ASSERT_NEAR(split_batched[i], split_alone[i], 2e-6) << i;
  }
}

TEST(BatchedDecodeAttention, RejectsBadRows) {
  const Batch b({4, 2, 16, 0, 4}, {5, 9}, 3);
  std::vector<float> out(2 * 64);
  std::vector<DecodeQuery> qs = b.queries(out);
  EXPECT_NO_THROW(decode_attention(qs, b.params()));
  qs[1].pos = 12;  // past the sequence's block table
  EXPECT_THROW(decode_attention(qs, b.params()), UsageError);
  qs = b.queries(out);
  qs[0].out = nullptr;
  EXPECT_THROW(decode_attention(qs, b.params()), UsageError);
  EXPECT_NO_THROW(decode_attention({}, b.params()));
  const AttentionParams bad{5, 2, 16, 1.0f};  // 5 heads over 2 KV heads
  EXPECT_THROW(decode_attention(b.queries(out), bad), UsageError);
}

}  // namespace batched_test
}  // namespace fp4serve::kernels
