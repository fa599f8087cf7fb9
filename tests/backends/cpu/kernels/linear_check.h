// SPDX-License-Identifier: Apache-2.0
// The float64 check, layer setup and target loop shared by the linear() tests (linear_test.cpp, linear_amx_test.cpp,
// linear_int8_test.cpp, linear_lm_head_test.cpp, linear_batch_invariant_test.cpp).
#pragma once

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "backends/cpu/kernels/linear.h"
#include "backends/cpu/prepare/repack.h"
#include "quant/checkpoint_tensors.h"
#include "quant/formats.h"

namespace fp4serve::kernels::testing_util {

// Runs body on each supported SIMD target (the dispatch pinned to it), and on one with AVX512-BF16 dot products
// once more with them switched off (the FMA kernels); leaves the dispatch unpinned.
inline void for_each_target(const std::function<void()>& body) {
  for (int64_t t : gemm_targets()) {
    hwy::SetSupportedTargetsForTest(t);
    SCOPED_TRACE(hwy::TargetName(t));
    body();
    if (bf16_dot_active()) {
      set_bf16_dot_allowed(false);
      SCOPED_TRACE("bf16 dot products off");
      body();
      set_bf16_dot_allowed(true);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Checks y [m, N] (from linear with x [m, K]) against Σ x·w (+ bias) in float64: every prepared weight decodes to
// its exact value in fp32, so the only error is fp32 accumulation over K plus the global-scale and bias roundings,
// |y − y64| ≤ (K + 4)·2^−24·(Σ|x·w| + |bias|), plus extra·Σ|x·w| for a kernel that approximates x (a bf16 pair).
inline void check_against_float64(const testing::Layer& l, const std::vector<float>& bias, const std::vector<float>& x,
                                  int64_t m, const std::vector<float>& y, double extra = 0.0) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t n = 0; n < l.n; ++n) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < l.k; ++k) {
        const double p = static_cast<double>(x[static_cast<size_t>(i * l.k + k)]) * l.w[static_cast<size_t>(n * l.k + k)];
        ref += p;
        mag += std::fabs(p);
      }
      if (!bias.empty()) {
        ref += bias[static_cast<size_t>(n)];
        mag += std::fabs(bias[static_cast<size_t>(n)]);
      }
      const double got = y[static_cast<size_t>(i * l.n + n)];
      ASSERT_FALSE(std::isnan(got)) << "y[" << i << ", " << n << "] not written";
      ASSERT_LE(std::fabs(got - ref), (static_cast<double>(l.k + 4) * 0x1p-24 + extra) * mag + 1e-30)
          << "y[" << i << ", " << n << "] m=" << m << " N=" << l.n << " K=" << l.k;
    }
  }
}

// An int4 layer of testing::make_int4 (group -1: channel-wise) prepared as load_model would: zero points when
// asymmetric, the g_idx permutation when act-ordered.
inline prepare::PreparedLinear prepare_int4_layer(const testing::Layer& l, int64_t group, bool asym, bool actorder) {
  const core::TensorView zp = l.zero_point.view(), gi = l.g_idx.view();
  return prepare::prepare_int4(l.weight.view(), l.scale.view(), asym ? &zp : nullptr, actorder ? &gi : nullptr, l.k,
                               group, "t");
}

// x rounded to bf16 (nearest even, quant::'s scalar rounding) and widened back: the activations the bf16 kernels
// multiply.
inline std::vector<float> rounded_to_bf16(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = quant::bf16_to_float(quant::float_to_bf16(x[i]));
  return out;
}

// Float64 weights rounded through fp32 to bf16: the weights the bf16 panels hold for FP8, Int8 and Int4 layers
// (exact in fp32 before the one rounding).
inline std::vector<double> rounded_to_bf16(const std::vector<double>& w) {
  std::vector<double> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = quant::bf16_to_float(quant::float_to_bf16(static_cast<float>(w[i])));
  return out;
}

}  // namespace fp4serve::kernels::testing_util
