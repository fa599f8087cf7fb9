// SPDX-License-Identifier: Apache-2.0
// attention() in batch-invariant mode (backends/cpu/kernels/batch_invariant.h): the output of a query row is bit for
// bit the same however the sequence's rows were cut into calls (one prefill, chunks of 2, 3, 7, 16, one row at a
// time as decode steps) and with 1 to 3 threads, on every SIMD target, for fp32 and bf16 caches, GQA, a sliding
// window and sinks; the default mode provably differs (one call against row by row), so the check can fail.
#include <cstring>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <omp.h>

#include "backends/cpu/kernels/attention.h"
#include "backends/cpu/kernels/batch_invariant.h"
#include "backends/cpu/kernels/ops_test_util.h"
#include "quant/formats.h"

namespace fp4serve::kernels::attention_invariant {
namespace {

using testing::for_each_simd_target;
using testing::random_nonzero;

struct Shape {
  int64_t heads, kv_heads, head_dim, window;
  bool sinks;
  KvElement element;
};

constexpr int64_t kRows = 150;  // long enough that decode rows split their keys by default (≥ 2·kMinKeysPerSplit)

class ChunkedRuns {
 public:
  explicit ChunkedRuns(const Shape& s) : s_(s) {
    const int64_t d = s.head_dim, kvh = s.kv_heads;
    q_ = random_nonzero(kRows * s.heads * d, 71, 0.05f, 1.5f);
    const std::vector<float> k = random_nonzero(kRows * kvh * d, 72, 0.05f, 1.5f);
    const std::vector<float> v = random_nonzero(kRows * kvh * d, 73);
    // model::KvCache's layout: [KVH][positions][D].
    const size_t bytes = static_cast<size_t>(kv_element_bytes(s.element));
    keys_.resize(k.size() * bytes);
    values_.resize(v.size() * bytes);
    for (int64_t h = 0; h < kvh; ++h) {
      for (int64_t p = 0; p < kRows; ++p) {
        const int64_t from = (p * kvh + h) * d, to = (h * kRows + p) * d;
        write_kv_row(k.data() + from, d, s.element, keys_.data() + to * bytes);
        write_kv_row(v.data() + from, d, s.element, values_.data() + to * bytes);
      }
    }
    sinks_ = random_nonzero(s.heads, 74, 0.1f, 3.0f);
  }

  // The outputs of all rows with the sequence cut into calls of `chunk` rows (the last one shorter) on `threads`.
  std::vector<float> run(int64_t chunk, int threads) const {
    const int64_t width = s_.heads * s_.head_dim;
    std::vector<float> out(static_cast<size_t>(kRows * width));
    const AttentionParams params{s_.heads, s_.kv_heads, s_.head_dim, 0.125f, s_.window,
                                 s_.sinks ? sinks_.data() : nullptr};
    const KvRows rows{keys_.data(), values_.data(), s_.head_dim, kRows * s_.head_dim, s_.element};
    const int was = omp_get_max_threads();
    omp_set_num_threads(threads);
    for (int64_t start = 0; start < kRows; start += chunk) {
      const int64_t t = std::min(chunk, kRows - start);
      attention(q_.data() + start * width, t, start, rows, params, out.data() + start * width);
    }
    omp_set_num_threads(was);
    return out;
  }

 private:
  Shape s_;
  std::vector<float> q_, sinks_;
  std::vector<std::byte> keys_, values_;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const Shape kShapes[] = {
    {9, 3, 64, 0, false, KvElement::Bf16},   // the default model's attention, bf16 cache
    {4, 1, 40, 0, false, KvElement::F32},    // one KV head (decode splits its keys), a head dim with a column tail
    {8, 2, 64, 37, true, KvElement::F32},    // GPT-OSS: sliding window and sinks
    {6, 6, 32, 0, true, KvElement::F16},
};

TEST(AttentionBatchInvariant, RowsDoNotDependOnChunksOrThreads) {
  const BatchInvariantScope on(true);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "H " << s.heads << " KVH " << s.kv_heads << " D " << s.head_dim << " window "
                                      << s.window << " sinks " << s.sinks << " " << kv_element_name(s.element));
    const ChunkedRuns setup(s);
    for_each_simd_target([&] {
      const std::vector<float> whole = setup.run(kRows, 1);
      const std::pair<int64_t, int> runs[] = {{1, 1}, {1, 2}, {2, 2}, {3, 1}, {7, 3}, {16, 2}, {kRows, 3}};
      for (const auto& [chunk, threads] : runs) {
        EXPECT_TRUE(same_bits(setup.run(chunk, threads), whole)) << "chunks of " << chunk << ", " << threads << " threads";
      }
    });
  }
}

// The default mode runs a prefill blocked and decode rows as dot products (with their keys split across threads):
// the same rows differ in their last bits, so the comparison above can fail (it does with the mode off: chunks of 1,
// 2, 3, 7 and 16 rows and 2 or more threads all differed from the one-call prefill).
TEST(AttentionBatchInvariant, DefaultModeDiffersSoTheCheckCanFail) {
  const BatchInvariantScope off(false);
  const ChunkedRuns setup(kShapes[0]);
  EXPECT_FALSE(same_bits(setup.run(1, 2), setup.run(kRows, 2)));
}

}  // namespace
}  // namespace fp4serve::kernels::attention_invariant
