// SPDX-License-Identifier: Apache-2.0
// rms_norm against a float64 evaluation of HF LlamaRMSNorm written here.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/kernels/norm.h"
#include "backends/cpu/kernels/ops_test_util.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels {
namespace {

using testing::for_each_simd_target;
using testing::poisoned;
using testing::random_nonzero;

std::vector<double> rms_norm_ref(const std::vector<float>& x, const std::vector<float>& w, int64_t rows, int64_t dim,
                                 double eps) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = double(w[i]) * x[r * dim + i] * inv;
  }
  return out;
}

TEST(RmsNorm, MatchesFloat64OnOddShapesEveryTarget) {
  // Rows of very different scales check that eps and the mean are applied per row.
  for (int64_t dim : {1, 7, 33, 576, 4099}) {
    const int64_t rows = 5;
    std::vector<float> x = random_nonzero(rows * dim, 11 + dim, 0.01f, 3.0f);
    for (int64_t i = 0; i < dim; ++i) x[i] *= 1e-3f;
    const std::vector<float> w = random_nonzero(dim, 29 + dim, 0.5f, 1.5f);
    const double eps = 1e-5;
    const std::vector<double> ref = rms_norm_ref(x, w, rows, dim, eps);
    for_each_simd_target([&] {
      std::vector<float> out = poisoned(x.size());
      rms_norm(x.data(), w.data(), rows, dim, float(eps), out.data());
      for (size_t i = 0; i < out.size(); ++i) {
        // fp32 sum of squares over ≤ 4099 terms, lane-parallel: relative error ≲ 1e-6; allow 4e-6.
        ASSERT_NEAR(out[i], ref[i], 4e-6 * std::abs(ref[i]) + 1e-7) << "dim " << dim << " element " << i;
      }
    });
  }
}

TEST(RmsNorm, InPlaceGivesSameResult) {
  const int64_t rows = 3, dim = 45;
  std::vector<float> x = random_nonzero(rows * dim, 5);
  const std::vector<float> w = random_nonzero(dim, 6);
  std::vector<float> out = poisoned(x.size());
  rms_norm(x.data(), w.data(), rows, dim, 1e-6f, out.data());
  rms_norm(x.data(), w.data(), rows, dim, 1e-6f, x.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], out[i]);
}

TEST(RmsNorm, HandCheckedValue) {
  // x = [3, 4]: mean(x²) = 12.5, rsqrt = 0.28284271; weight [1, 2] → [0.8485281, 2.2627417].
  const float x[2] = {3, 4}, w[2] = {1, 2};
  float out[2];
  rms_norm(x, w, 1, 2, 0.0f, out);
  EXPECT_NEAR(out[0], 0.84852814f, 1e-6f);
  EXPECT_NEAR(out[1], 2.26274170f, 1e-6f);
}

TEST(RmsNorm, RejectsBadArguments) {
  float x[4] = {1, 2, 3, 4};
  EXPECT_THROW(rms_norm(x, x, 1, 0, 1e-5f, x), UsageError);
  EXPECT_THROW(rms_norm(x, x, -1, 4, 1e-5f, x), UsageError);
  EXPECT_THROW(rms_norm(nullptr, x, 1, 4, 1e-5f, x), UsageError);
  EXPECT_THROW(rms_norm(x, x, 1, 4, -1.0f, x), UsageError);
}

}  // namespace
}  // namespace fp4serve::kernels
