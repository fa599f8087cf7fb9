// SPDX-License-Identifier: Apache-2.0
// Activations against float64 formulas written here (HF ACT2FN definitions, GPT-OSS GptOssExperts).
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/kernels/activation.h"
#include "backends/cpu/kernels/ops_test_util.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels {
namespace {

using testing::for_each_simd_target;
using testing::poisoned;
using testing::random_nonzero;

double silu_ref(double g) { return g / (1 + std::exp(-g)); }
double swiglu_oai_ref(double g, double u, double alpha, double limit) {
  g = std::min(g, limit);
  u = std::clamp(u, -limit, limit);
  return (u + 1) * g / (1 + std::exp(-alpha * g));
}

// Inputs span ±12 so the GPT-OSS clamps at ±7 and the saturated sigmoid tails are exercised.
void check_gated(const char* name, const std::function<void(const float*, int64_t, int64_t, float*)>& op,
                 const std::function<double(double, double)>& ref) {
  for (int64_t inter : {1, 7, 37, 1001}) {
    const int64_t m = 3;
    const std::vector<float> x = random_nonzero(m * 2 * inter, 100 + inter, 0.01f, 12.0f);
    for_each_simd_target([&] {
      std::vector<float> out = poisoned(m * inter);
      op(x.data(), m, inter, out.data());
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t i = 0; i < inter; ++i) {
          const double g = x[r * 2 * inter + i], u = x[r * 2 * inter + inter + i];
          const double want = ref(g, u);
          // fp32 evaluation with Highway Exp (1 ulp): relative 2e-6 of the result, plus the sigmoid's rounding
          // as an absolute error on a value in (0, 1), scaled by |g·u|.
          const double tol = 2e-6 * std::abs(want) + 2e-6 * std::abs(g * u) + 1e-30;
          ASSERT_NEAR(out[r * inter + i], want, tol) << name << " inter " << inter << " row " << r << " i " << i;
        }
      }
    });
  }
}

TEST(Activation, SiluAndMulMatchesFloat64) {
  check_gated("silu_and_mul", silu_and_mul, [](double g, double u) { return silu_ref(g) * u; });
}

TEST(Activation, SwigluOaiAndMulMatchesFloat64) {
  check_gated(
      "swiglu_oai_and_mul",
      [](const float* x, int64_t m, int64_t inter, float* out) { swiglu_oai_and_mul(x, m, inter, 1.702f, 7.0f, out); },
      [](double g, double u) { return swiglu_oai_ref(g, u, 1.702, 7.0); });
}

TEST(Activation, SwigluOaiHandCheckedClamps) {
  // gate 8 → 7 (upper clamp), up −9 → −7: (−7 + 1) · 7 · sigmoid(1.702 · 7) = −42 · 0.99999334 = −41.99972.
  // gate −9 is not clamped below: (2 + 1) · (−9) · sigmoid(−15.318) = −27 · 2.2288e−7 = −6.0178e−6.
  const float x[4] = {8.0f, -9.0f, -9.0f, 2.0f};  // rows: (gate 8 | up −9), (gate −9 | up 2)
  float out[2];
  swiglu_oai_and_mul(x, 2, 1, 1.702f, 7.0f, out);
  EXPECT_NEAR(out[0], -41.99972, 1e-4);
  EXPECT_NEAR(out[1], -27 / (1 + std::exp(15.318)), 1e-9);
  EXPECT_LT(out[1], 0.0f);
}

TEST(Activation, RejectsBadArguments) {
  float x[4] = {1, 2, 3, 4}, out[2];
  EXPECT_THROW(silu_and_mul(x, -1, 2, out), UsageError);
  EXPECT_THROW(silu_and_mul(nullptr, 1, 2, out), UsageError);
  EXPECT_THROW(swiglu_oai_and_mul(x, 1, 2, 1.702f, 0.0f, out), UsageError);
  EXPECT_THROW(swiglu_oai_and_mul(x, 1, -2, 1.702f, 7.0f, out), UsageError);
  EXPECT_NO_THROW(silu_and_mul(nullptr, 0, 5, nullptr));
}

}  // namespace
}  // namespace fp4serve::kernels
