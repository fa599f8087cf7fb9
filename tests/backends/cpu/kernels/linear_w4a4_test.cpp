// SPDX-License-Identifier: Apache-2.0
// W4A4 emulation: the activation quantizer is re-implemented here from docs/FORMATS.md §2.1 (thresholds of
// §0.1 for E2M1, byte layout of §0.2 for E4M3) and the product checked in float64 on every target.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <limits>

#include "backends/cpu/kernels/linear.h"
#include "fp4serve/error.h"
#include "quant/checkpoint_tensors.h"
#include "backends/cpu/prepare/repack.h"

namespace fp4serve::kernels {
namespace {

using prepare::GlobalScaleConvention;

// E2M1 round-to-nearest-even by the thresholds of FORMATS.md §0.1 (input already clamped to ±6).
double e2m1_round(float v) {
  const double a = std::fabs(static_cast<double>(v));
  double r;
  if (a <= 0.25) r = 0.0;
  else if (a < 0.75) r = 0.5;
  else if (a <= 1.25) r = 1.0;
  else if (a < 1.75) r = 1.5;
  else if (a <= 2.5) r = 2.0;
  else if (a < 3.5) r = 3.0;
  else if (a <= 5.0) r = 4.0;
  else r = 6.0;
  return std::signbit(v) ? -r : r;
}

// E4M3 RNE with saturation for a non-negative fp32, by search over the 127 finite non-negative codes.
double e4m3_round(float v) {
  double best = 0, best_err = std::numeric_limits<double>::infinity();
  int best_code = 0;
  for (int c = 0; c < 0x7F; ++c) {
    const double e = std::fabs(testing::e4m3_value(static_cast<uint8_t>(c)) - v);
    if (e < best_err || (e == best_err && (c & 1) == 0 && (best_code & 1) == 1)) {
      best_err = e;
      best = testing::e4m3_value(static_cast<uint8_t>(c));
      best_code = c;
    }
  }
  return best;
}

TEST(LinearW4A4, EmulationMatchesTheCompressedTensorsQuantizerInFloat64) {
  std::mt19937 rng(201);
  const int64_t n = 19, k = 80;
  const testing::Layer l = testing::make_nvfp4(rng, n, k, true);
  prepare::PreparedLinear w = prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                                     GlobalScaleConvention::Divisor, "t");
  const float igs = 448.f * 6.f / 3.7f;  // as llm-compressor derives it from an observed amax of 3.7
  prepare::set_input_global_scale(w, igs, GlobalScaleConvention::Divisor);
  for (int64_t m : {1, 3, 7, 33}) {
    std::normal_distribution<float> dist(0.f, 1.f);
    std::vector<float> x(static_cast<size_t>(m * k));
    for (auto& v : x) v = dist(rng);
    for (int64_t j = 0; j < 16; ++j) x[static_cast<size_t>(16 + j)] = 0.f;  // an all-zero group: scale 0 → 0.125
    // Reference activations: x_q · s_a / igs with the quantizer written out here.
    std::vector<double> xq(x.size());
    for (size_t g = 0; g < x.size(); g += 16) {
      float amax = 0.f;
      for (size_t j = 0; j < 16; ++j) amax = std::fmax(amax, std::fabs(x[g + j]));
      double s = e4m3_round(std::fmin(igs * amax / 6.f, 448.f));
      if (s == 0.0) s = 0.125;
      const float step = static_cast<float>(s) / igs;
      for (size_t j = 0; j < 16; ++j) {
        const float v = std::fmax(std::fmin(x[g + j] / step, 6.f), -6.f);
        xq[g + j] = e2m1_round(v) * s / igs;
      }
    }
    std::vector<float> y(static_cast<size_t>(m * n));
    for (int64_t t : gemm_targets()) {
      hwy::SetSupportedTargetsForTest(t);
      SCOPED_TRACE(hwy::TargetName(t));
      std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
      linear(w, x.data(), m, y.data(), ActivationEmulation::EmulateNvfp4);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t r = 0; r < n; ++r) {
          double ref = 0, mag = 0;
          for (int64_t c = 0; c < k; ++c) {
            const double p = xq[static_cast<size_t>(i * k + c)] * l.w[static_cast<size_t>(r * k + c)];
            ref += p;
            mag += std::fabs(p);
          }
          const double got = y[static_cast<size_t>(i * n + r)];
          ASSERT_FALSE(std::isnan(got));
          // x_q·s_a/igs carries one fp32 rounding per element on top of the GEMM bound.
          ASSERT_LE(std::fabs(got - ref), static_cast<double>(k + 6) * 0x1p-24 * mag + 1e-30) << i << "," << r;
        }
      }
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

TEST(LinearW4A4, EmulationChangesTheResult) {
  // Guards against the option being ignored: quantized activations differ from fp32 ones.
  std::mt19937 rng(202);
  const testing::Layer l = testing::make_nvfp4(rng, 8, 32, true);
  prepare::PreparedLinear w = prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                                     GlobalScaleConvention::Divisor, "t");
  prepare::set_input_global_scale(w, 500.f, GlobalScaleConvention::Divisor);
  std::vector<float> x(32);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (auto& v : x) v = dist(rng);
  std::vector<float> a(8), b(8);
  linear(w, x.data(), 1, a.data());
  linear(w, x.data(), 1, b.data(), ActivationEmulation::EmulateNvfp4);
  EXPECT_NE(a, b);
}

TEST(LinearW4A4, MissingInputGlobalScaleIsAUsageError) {
  std::mt19937 rng(203);
  const testing::Layer l = testing::make_nvfp4(rng, 8, 32, true);
  const prepare::PreparedLinear w = prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                                           GlobalScaleConvention::Divisor, "t");
  std::vector<float> x(32, 1.f), y(8);
  EXPECT_THROW(linear(w, x.data(), 1, y.data(), ActivationEmulation::EmulateNvfp4), UsageError);
}

}  // namespace
}  // namespace fp4serve::kernels
