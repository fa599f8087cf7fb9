// SPDX-License-Identifier: Apache-2.0
// ActivationPrecision::Int8 for NVFP4 and MXFP4, on every target its kernels are compiled for (the portable one
// runs the scalar loop), against float64 references computed here from the checkpoint tensors
// (tests/prepare/checkpoint_tensors.h):
// - the activation quantizer against its rule in float64 (d = amax/127, |q − x/d| ≤ ½);
// - linear() against Σ x̂·w in float64, x̂ = q·d the quantized activations: the integer group sums are exact, so
//   the only error is fp32 rounding of the per-group scaling and accumulation, |y − y64| ≤ 2(G + 4)·2^−24·Σ|x̂·w|;
//   the fp32-activation path misses this bound by orders of magnitude (x̂ − x is about d/4 per element);
// - linear() against Σ x·w of the unquantized x within the quantization bound Σ_k |w|·d/2 of linear.h.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <functional>
#include <limits>

#include "fp4serve/error.h"
#include "kernels/linear.h"
#include "prepare/checkpoint_tensors.h"
#include "prepare/repack.h"

namespace fp4serve::kernels {
namespace {

using prepare::ActivationPrecision;
using prepare::PreparedLinear;
using testing::Layer;

// 1..4 one pass of the AVX2 kernel, 1..8 of the AVX-512 one; 5, 9, 17 several passes (chunks of rows).
constexpr int64_t kMs[] = {1, 2, 3, 4, 5, 8, 9, 17};

void for_each_int8_target(const std::function<void()>& body) {
  const auto targets = int8_gemm_targets();
  ASSERT_FALSE(targets.empty());
  for (int64_t t : targets) {
    hwy::SetSupportedTargetsForTest(t);
    SCOPED_TRACE(hwy::TargetName(t));
    ASSERT_STREQ(int8_gemm_target_name(), hwy::TargetName(t));
    body();
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Normal values with one group in eight scaled by 50 (an outlier group) and none exactly zero.
std::vector<float> random_x(std::mt19937& rng, int64_t m, int64_t k) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (size_t i = 0; i < x.size(); ++i) {
    float v = dist(rng);
    if (v == 0.f) v = 0.25f;
    x[i] = (i / 16) % 8 == 3 ? 50.f * v : v;
  }
  return x;
}

TEST(QuantizeActivationsInt8, FollowsTheRuleInFloat64) {
  std::mt19937 rng(7);
  for (int64_t block : {16, 32}) {
    const int64_t m = 3, k = 7 * block;
    auto x = random_x(rng, m, k);
    for (int64_t j = 0; j < block; ++j) x[static_cast<size_t>(k + j)] = 0.f;  // row 1, group 0: all zero
    std::vector<int8_t> q(static_cast<size_t>(m * k), 99);
    std::vector<float> d(static_cast<size_t>(m * k / block), -1.f);
    quantize_activations_int8(x.data(), m, k, block, q.data(), d.data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t g = 0; g < k / block; ++g) {
        double amax = 0;
        for (int64_t j = 0; j < block; ++j) amax = std::max(amax, std::fabs(static_cast<double>(x[static_cast<size_t>(i * k + g * block + j)])));
        const double dg = d[static_cast<size_t>(i * (k / block) + g)];
        ASSERT_NEAR(dg, amax / 127, amax / 127 * 1e-7) << "row " << i << " group " << g;
        bool full = amax == 0;
        for (int64_t j = 0; j < block; ++j) {
          const size_t at = static_cast<size_t>(i * k + g * block + j);
          const int qv = q[at];
          ASSERT_LE(std::abs(qv), 127);
          if (amax == 0) {
            ASSERT_EQ(qv, 0);
            continue;
          }
          ASSERT_LE(std::fabs(qv - x[at] * 127.0 / amax), 0.5 + 1e-5) << "x " << x[at] << " row " << i << " col " << g * block + j;
          full = full || std::abs(qv) == 127;
        }
        ASSERT_TRUE(full) << "the largest |x| of a block maps to ±127";
      }
    }
  }
  EXPECT_THROW(quantize_activations_int8(nullptr, 1, 20, 16, nullptr, nullptr), UsageError);
}

// linear() with Int8 against Σ x̂·w (tight) and Σ x·w (quantization bound), x̂ from quantize_activations_int8.
void check_int8(PreparedLinear& w, const Layer& l, int64_t group, std::mt19937& rng) {
  w.activation_precision = ActivationPrecision::Int8;
  const int64_t groups = l.k / group;
  for (int64_t m : kMs) {
    const auto x = random_x(rng, m, l.k);
    std::vector<int8_t> q(static_cast<size_t>(m * l.k));
    std::vector<float> d(static_cast<size_t>(m * groups));
    quantize_activations_int8(x.data(), m, l.k, group, q.data(), d.data());
    std::vector<float> y(static_cast<size_t>(m * l.n));
    for_each_int8_target([&] {
      std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
      linear(w, x.data(), m, y.data());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t n = 0; n < l.n; ++n) {
          double ref_q = 0, mag_q = 0, ref_x = 0, quant_bound = 0;
          for (int64_t k = 0; k < l.k; ++k) {
            const size_t xi = static_cast<size_t>(i * l.k + k);
            const double wv = l.w[static_cast<size_t>(n * l.k + k)];
            const double dg = d[static_cast<size_t>(i * groups + k / group)];
            const double xhat = q[xi] * dg;
            ref_q += xhat * wv;
            mag_q += std::fabs(xhat * wv);
            ref_x += x[xi] * wv;
            quant_bound += std::fabs(wv) * dg / 2;
          }
          const double got = y[static_cast<size_t>(i * l.n + n)];
          ASSERT_FALSE(std::isnan(got)) << "y[" << i << ", " << n << "] not written";
          ASSERT_LE(std::fabs(got - ref_q), 2.0 * static_cast<double>(groups + 4) * 0x1p-24 * mag_q + 1e-30)
              << "y[" << i << ", " << n << "] vs the quantized activations, m=" << m << " N=" << l.n << " K=" << l.k;
          ASSERT_LE(std::fabs(got - ref_x), quant_bound * (1 + 1e-4) + 1e-5 * mag_q + 1e-30)
              << "y[" << i << ", " << n << "] vs the fp32 activations, m=" << m << " N=" << l.n << " K=" << l.k;
        }
      }
    });
  }
}

TEST(LinearInt8, Nvfp4MatchesFloat64) {
  std::mt19937 rng(201);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 16}, {13, 48}, {29, 80}, {37, 544}}) {
    for (bool divisor : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "N " << n << " K " << k << " divisor " << divisor);
      const Layer l = testing::make_nvfp4(rng, n, k, divisor);
      PreparedLinear w = prepare::prepare_nvfp4(
          l.weight.view(), l.scale.view(), l.global_scale,
          divisor ? prepare::GlobalScaleConvention::Divisor : prepare::GlobalScaleConvention::Multiplier, "t");
      check_int8(w, l, 16, rng);
    }
  }
}

TEST(LinearInt8, Mxfp4MatchesFloat64) {
  std::mt19937 rng(202);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 32}, {13, 96}, {37, 544}}) {
    SCOPED_TRACE(::testing::Message() << "N " << n << " K " << k);
    const Layer l = testing::make_mxfp4(rng, n, k);
    PreparedLinear w = prepare::prepare_mxfp4(l.weight.view(), l.scale.view(), "t");
    check_int8(w, l, 32, rng);
  }
}

TEST(LinearInt8, NanAndInfInputsReachTheOutputs) {
  std::mt19937 rng(204);
  const Layer l = testing::make_nvfp4(rng, 24, 64, true);
  PreparedLinear w = prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                            prepare::GlobalScaleConvention::Divisor, "t");
  w.activation_precision = ActivationPrecision::Int8;
  auto x = random_x(rng, 3, 64);
  x[5] = std::numeric_limits<float>::quiet_NaN();          // row 0
  x[64 + 20] = std::numeric_limits<float>::infinity();     // row 1
  std::vector<float> y(3 * 24);
  for_each_int8_target([&] {
    linear(w, x.data(), 3, y.data());
    for (int64_t n = 0; n < 24; ++n) {
      EXPECT_TRUE(std::isnan(y[static_cast<size_t>(n)])) << "row 0, n " << n;
      EXPECT_FALSE(std::isfinite(y[static_cast<size_t>(24 + n)])) << "row 1, n " << n;
      EXPECT_TRUE(std::isfinite(y[static_cast<size_t>(48 + n)])) << "row 2, n " << n;
    }
  });
}

TEST(LinearInt8, FusedRowsKeepThePrecisionAndRefuseAMix) {
  std::mt19937 rng(203);
  const Layer a = testing::make_mxfp4(rng, 16, 64), b = testing::make_mxfp4(rng, 8, 64);
  std::vector<PreparedLinear> parts;
  parts.push_back(prepare::prepare_mxfp4(a.weight.view(), a.scale.view(), "a"));
  parts.push_back(prepare::prepare_mxfp4(b.weight.view(), b.scale.view(), "b"));
  parts[0].activation_precision = ActivationPrecision::Int8;
  EXPECT_THROW(prepare::concat_rows(std::move(parts)), UsageError);
  parts.clear();
  parts.push_back(prepare::prepare_mxfp4(a.weight.view(), a.scale.view(), "a"));
  parts.push_back(prepare::prepare_mxfp4(b.weight.view(), b.scale.view(), "b"));
  for (auto& p : parts) p.activation_precision = ActivationPrecision::Int8;
  EXPECT_EQ(prepare::concat_rows(std::move(parts)).activation_precision, ActivationPrecision::Int8);
}

}  // namespace
}  // namespace fp4serve::kernels
