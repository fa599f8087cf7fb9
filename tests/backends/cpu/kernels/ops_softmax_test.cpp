// SPDX-License-Identifier: Apache-2.0
// softmax_rows and log_sum_exp against float64; top_k against a stable sort with the stated tie/NaN rule.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/kernels/ops_test_util.h"
#include "backends/cpu/kernels/softmax.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels {
namespace {

using testing::for_each_simd_target;
using testing::random_nonzero;

TEST(Softmax, MatchesFloat64WithLargeLogits) {
  for (int64_t n : {1, 3, 32, 129}) {
    const int64_t rows = 4;
    std::vector<float> x = random_nonzero(rows * n, 3 + n, 0.01f, 8.0f);
    for (int64_t i = 0; i < n; ++i) x[n + i] += 500.0f;  // row 1 would overflow exp without the max shift
    for_each_simd_target([&] {
      std::vector<float> y = x;
      softmax_rows(y.data(), rows, n);
      for (int64_t r = 0; r < rows; ++r) {
        double m = -INFINITY, sum = 0;
        for (int64_t i = 0; i < n; ++i) m = std::max(m, double(x[r * n + i]));
        for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[r * n + i]) - m);
        for (int64_t i = 0; i < n; ++i) {
          const double want = std::exp(double(x[r * n + i]) - m) / sum;
          ASSERT_NEAR(y[r * n + i], want, 2e-6 * want + 1e-12) << "n " << n << " row " << r << " i " << i;
        }
      }
    });
  }
}

// Vocabulary-sized rows (the perplexity scorer's use) and odd lengths; logits far above zero (the max shift) and a
// spread of 60 so that the smallest probabilities are ~1e-26, below what an fp32 probability could hold.
TEST(LogSumExp, MatchesFloat64) {
  for (int64_t n : {1, 7, 33, 49157}) {
    std::vector<float> x = random_nonzero(n, 11 + n, 0.01f, 30.0f);
    for (float& v : x) v += 400.0f;
    double m = -INFINITY, sum = 0;
    for (float v : x) m = std::max(m, double(v));
    for (float v : x) sum += std::exp(double(v) - m);
    const double want = m + std::log(sum);
    for_each_simd_target([&] {
      // A relative error of the fp32 sum of ε gives log_sum_exp an absolute error of ~ε.
      ASSERT_NEAR(log_sum_exp(x.data(), n), want, 5e-7) << "n " << n;
    });
  }
  EXPECT_THROW(log_sum_exp(nullptr, 3), UsageError);
  const float one = 1.0f;
  EXPECT_THROW(log_sum_exp(&one, 0), UsageError);
}

TEST(TopK, DescendingWithTiesToLowerIndex) {
  // Values drawn from a small set so ties are frequent; the reference is a stable sort by descending value.
  for (int64_t n : {1, 9, 32, 131}) {
    std::vector<float> v(n);
    std::vector<float> pool = random_nonzero(6, 77 + n);
    for (int64_t i = 0; i < n; ++i) v[i] = pool[(i * 7 + n) % 6];
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
    for (int64_t k : {int64_t{0}, int64_t{1}, std::min<int64_t>(4, n), n}) {
      std::vector<int32_t> idx(k + 1, -7);
      std::vector<float> val(k + 1, std::numeric_limits<float>::quiet_NaN());
      top_k(v.data(), n, k, idx.data(), val.data());
      for (int64_t i = 0; i < k; ++i) {
        ASSERT_EQ(idx[i], order[i]) << "n " << n << " k " << k << " rank " << i;
        ASSERT_EQ(val[i], v[order[i]]);
      }
      EXPECT_EQ(idx[k], -7);  // nothing written past k
    }
  }
}

TEST(TopK, NanRanksLastAndInfinitiesOrder) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float v[6] = {nan, -INFINITY, 2.0f, INFINITY, nan, 2.0f};
  int32_t idx[6];
  top_k(v, 6, 6, idx, nullptr);
  const int32_t want[6] = {3, 2, 5, 1, 0, 4};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(idx[i], want[i]) << i;
}

TEST(TopK, RejectsBadK) {
  float v[3] = {1, 2, 3};
  int32_t idx[4];
  EXPECT_THROW(top_k(v, 3, 4, idx, nullptr), UsageError);
  EXPECT_THROW(top_k(v, 3, -1, idx, nullptr), UsageError);
  EXPECT_THROW(top_k(nullptr, 3, 2, idx, nullptr), UsageError);
  EXPECT_THROW(softmax_rows(v, 1, 0), UsageError);
}

}  // namespace
}  // namespace fp4serve::kernels
