// SPDX-License-Identifier: Apache-2.0
// The in-memory lm_head copies (--lm-head-dtype fp8 | int8: prepare_dense_as_fp8_rows / _int8_rows) against their
// rules in float64, and linear() on them, on bf16 Dense weights and on FP8 checkpoint layers (the fused GEMV for
// m ≤ 4, the paths above; fp32 or bf16 x by the activation precision) on every compiled target against Σ x·ŵ in
// float64, ŵ the stored weight; bound as in linear_test.cpp: |y − y64| ≤ (K + 4)·2^−24·Σ|x·ŵ|.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "backends/cpu/kernels/linear.h"
#include "backends/cpu/kernels/linear_check.h"
#include "quant/checkpoint_tensors.h"
#include "backends/cpu/prepare/repack.h"
#include "quant/formats.h"

namespace fp4serve::kernels {
namespace {

using testing_util::rounded_to_bf16;

using prepare::PreparedLinear;
using testing::Layer;

constexpr int64_t kLmHeadMs[] = {1, 2, 3, 4, 5, 9};

// ŵ[n, k] by the rule: s = float(amax_row)/qmax, ŵ = decode(encode(w/s))·s, computed here in float64 from the
// stored row maximum (quant::float_to_e4m3 is checked against ml_dtypes' tables in the quant tests).
std::vector<double> expected_copy(const Layer& l, bool int8) {
  std::vector<double> out(l.w.size());
  for (int64_t r = 0; r < l.n; ++r) {
    double amax = 0;
    for (int64_t c = 0; c < l.k; ++c) amax = std::max(amax, std::fabs(l.w[static_cast<size_t>(r * l.k + c)]));
    const float s = amax > 0 ? static_cast<float>(amax) / (int8 ? 127.f : 448.f) : 1.f;
    for (int64_t c = 0; c < l.k; ++c) {
      const auto i = static_cast<size_t>(r * l.k + c);
      const float scaled = static_cast<float>(l.w[i]) / s;
      const double q = int8 ? std::nearbyint(static_cast<double>(scaled)) : quant::e4m3_to_float(quant::float_to_e4m3(scaled));
      out[i] = q * s;
    }
  }
  return out;
}

void check_linear(const PreparedLinear& w, const Layer& l, const std::vector<double>& what, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t m : kLmHeadMs) {
    std::vector<float> x(static_cast<size_t>(m * l.k));
    for (auto& v : x) v = dist(rng) + 1e-3f;
    std::vector<float> y(static_cast<size_t>(m * l.n));
    for (int64_t t : gemm_targets()) {
      hwy::SetSupportedTargetsForTest(t);
      SCOPED_TRACE(hwy::TargetName(t));
      std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
      linear(w, x.data(), m, y.data());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t n = 0; n < l.n; ++n) {
          double ref = 0, mag = 0;
          for (int64_t k = 0; k < l.k; ++k) {
            const double p = static_cast<double>(x[static_cast<size_t>(i * l.k + k)]) * what[static_cast<size_t>(n * l.k + k)];
            ref += p;
            mag += std::fabs(p);
          }
          const double got = y[static_cast<size_t>(i * l.n + n)];
          ASSERT_LE(std::fabs(got - ref), static_cast<double>(l.k + 4) * 0x1p-24 * mag + 1e-30)
              << "y[" << i << ", " << n << "] m=" << m << " N=" << l.n << " K=" << l.k;
        }
      }
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

TEST(LmHeadCopies, Fp8AndInt8RowsFollowTheirRulesAndRunExactly) {
  std::mt19937 rng(301);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{13, 29}, {37, 302}, {9, 576}}) {
    for (core::DType d : {core::DType::BF16, core::DType::F32}) {
      SCOPED_TRACE(::testing::Message() << "N " << n << " K " << k << " " << core::dtype_name(d));
      const Layer l = testing::make_dense(rng, n, k, d);
      for (bool int8 : {false, true}) {
        SCOPED_TRACE(int8 ? "int8" : "fp8");
        const PreparedLinear w = int8 ? prepare::prepare_dense_as_int8_rows(l.weight.view(), "lm_head")
                                      : prepare::prepare_dense_as_fp8_rows(l.weight.view(), "lm_head");
        EXPECT_EQ(prepare::weight_bytes(w), static_cast<size_t>(w.padded_rows * (k + 4)));
        const std::vector<double> want = expected_copy(l, int8);
        std::vector<float> got(static_cast<size_t>(n * k));
        dequantize(w, got.data());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_NEAR(got[i], want[i], std::fabs(want[i]) * 1e-6) << "element " << i;
        }
        // The encoding error itself: half an int8 step (s/2), resp. 2^-4 relative plus half E4M3's subnormal step.
        for (int64_t r = 0; r < n; ++r) {
          double amax = 0;
          for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(l.w[static_cast<size_t>(r * k + c)]));
          const double step = amax / (int8 ? 127 : 448);
          for (int64_t c = 0; c < k; ++c) {
            const auto i = static_cast<size_t>(r * k + c);
            // + the fp32 roundings of s and of w/s (≤ 127·2^−23 steps).
            const double bound = (int8 ? step / 2 : std::fabs(l.w[i]) * 0x1p-4 + step * 0x1p-10) + 128 * 0x1p-23 * step;
            ASSERT_LE(std::fabs(got[i] - l.w[i]), bound) << "row " << r << " col " << c;
          }
        }
        check_linear(w, l, want, rng);
      }
    }
  }
}

TEST(LmHeadCopies, Bf16DenseGemvMatchesFloat64) {
  std::mt19937 rng(302);
  // K = 302: a column pair left after the unrolled loop on AVX2; 301: odd K takes the panel path.
  for (auto [n, k] : {std::pair<int64_t, int64_t>{37, 302}, {11, 301}, {16, 576}}) {
    SCOPED_TRACE(::testing::Message() << "N " << n << " K " << k);
    const Layer l = testing::make_dense(rng, n, k, core::DType::BF16);
    const PreparedLinear w = prepare::prepare_dense(l.weight.view(), "lm_head");
    check_linear(w, l, l.w, rng);
  }
}

// y = linear(w, x) under each ActivationPrecision where the bf16 rule (linear.h) says x is rounded to bf16
// (bf16_x(m): Bf16 / Bf16DecodeInt8 only, AVX512-BF16 active, plus the layer's own conditions) must be Σ bf16(x)·w_bf16
// (float64, the fp32 bound), and differ from the exact-x result beyond that bound (the rounding provably
// happened); everywhere else (other targets, dot products switched off, Fp32 / Int8 precision) Σ x·w_exact on the
// exact x. w_bf16: the weights the bf16 panel holds (bf16 Dense: w itself; FP8 / Int8: w rounded to bf16).
template <class Bf16Rows>
void check_bf16_rule(PreparedLinear& w, int64_t n, int64_t k, const std::vector<double>& w_exact,
                     const std::vector<double>& w_bf16, const std::vector<int64_t>& ms, Bf16Rows&& bf16_rows,
                     std::mt19937& rng) {
  using prepare::ActivationPrecision;
  std::normal_distribution<float> dist(0.f, 1.f);
  for (ActivationPrecision precision : {ActivationPrecision::Bf16, ActivationPrecision::Bf16DecodeInt8,
                                        ActivationPrecision::Fp32, ActivationPrecision::Int8}) {
    w.activation_precision = precision;
    const bool allows = precision == ActivationPrecision::Bf16 || precision == ActivationPrecision::Bf16DecodeInt8;
    for (int64_t m : ms) {
      SCOPED_TRACE(::testing::Message() << "N " << n << " K " << k << " " << prepare::activation_precision_name(precision)
                                        << " m " << m);
      std::vector<float> x(static_cast<size_t>(m * k));
      for (auto& v : x) v = dist(rng) + 1e-3f;
      const std::vector<float> rounded = rounded_to_bf16(x);
      std::vector<float> y(static_cast<size_t>(m * n));
      auto check = [&] {
        const bool bf16_x = allows && bf16_rows(m) && bf16_dot_active();
        std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
        linear(w, x.data(), m, y.data());
        const std::vector<float>& xin = bf16_x ? rounded : x;
        const std::vector<double>& win = bf16_x ? w_bf16 : w_exact;
        double worst_exact = 0;  // against Σ x·w on the exact x and weights, relative to Σ |x·w|
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t r = 0; r < n; ++r) {
            double ref = 0, mag = 0, exact = 0;
            for (int64_t c = 0; c < k; ++c) {
              const auto at = static_cast<size_t>(r * k + c);
              ref += static_cast<double>(xin[static_cast<size_t>(i * k + c)]) * win[at];
              exact += static_cast<double>(x[static_cast<size_t>(i * k + c)]) * w_exact[at];
              mag += std::fabs(static_cast<double>(xin[static_cast<size_t>(i * k + c)]) * win[at]);
            }
            const double got = y[static_cast<size_t>(i * n + r)];
            ASSERT_LE(std::fabs(got - ref), static_cast<double>(k + 4) * 0x1p-24 * mag + 1e-30)
                << "y[" << i << ", " << r << "] bf16 x: " << bf16_x;
            worst_exact = std::max(worst_exact, std::fabs(got - exact) / mag);
          }
        }
        if (bf16_x) {
          EXPECT_GT(worst_exact, static_cast<double>(k + 4) * 0x1p-24) << "x was not rounded";
        }
      };
      testing_util::for_each_target(check);
    }
  }
}


// A bf16 lm_head under ActivationPrecision Bf16 / Bf16DecodeInt8 (linear.h): above the fused GEMV's 4 rows, with
// AVX512-BF16 dot products active and K % 16 == 0, bf16 x on the exact bf16 weights. Odd shapes: N not a multiple
// of the 8-row tile nor of the 32-row AVX-512 panel, K = 16 × odd, one and several 256-column panel chunks; with
// AVX512-BF16, m = 5 … 64 the kernel on the stored tiles (16 rows per pass: 16, 17 and 33 more than one, 64 the
// last), 65 the blocked panel; N = 37 and 130 end in a lone tile. K = 302 keeps fp32 x.
TEST(LmHeadCopies, Bf16DenseTakesBf16DotsWhereThePrecisionAllows) {
  std::mt19937 rng(303);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{37, 48}, {77, 336}, {130, 560}, {19, 302}}) {
    const Layer l = testing::make_dense(rng, n, k, core::DType::BF16);
    PreparedLinear w = prepare::prepare_dense(l.weight.view(), "lm_head");
    check_bf16_rule(w, n, k, l.w, l.w, {1, 4, 5, 9, 13, 16, 17, 33, 64, 65},
                    [k = k](int64_t m) { return m > 4 && k % 16 == 0; }, rng);
  }
}

// FP8 checkpoint layers (tensor, channel and block scales, bf16 in the checkpoint as llm-compressor writes
// them) and the --lm-head-dtype fp8 / int8 copies under the same rule: bf16 x on panels of code · scale rounded to
// bf16, the bf16 weights compressed-tensors dequantizes to (here from float64: e4m3 · scale is exact there).
// m ≤ 4 keeps the fp32-x GEMV (block scales too); K = 40 (not a multiple of 16) keeps fp32 x. N = 45 and 130 end
// in a lone tile, K = 400 ends in a partial 128-column block.
TEST(LmHeadCopies, Fp8AndInt8TakeBf16DotsWhereThePrecisionAllows) {
  std::mt19937 rng(304);
  const std::vector<int64_t> ms = {1, 3, 4, 5, 9, 16, 33, 65};
  for (auto [n, k] : {std::pair<int64_t, int64_t>{45, 272}, {130, 400}, {24, 40}}) {
    // make_fp8 kinds: tensor, channel, 128 × 128 blocks, and 16 × 34 blocks (34 ≡ 2 mod 4: a group boundary falls
    // between the two column pairs that the panel decoder packs together).
    for (int kind : {0, 1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "fp8 scale kind " << kind);
      const std::array<int64_t, 2> block = kind == 2 ? std::array<int64_t, 2>{128, 128}
                                           : kind == 3 ? std::array<int64_t, 2>{16, 34}
                                                       : std::array<int64_t, 2>{0, 0};
      const Layer l = kind >= 2 ? testing::make_fp8(rng, n, k, 2, block[0], block[1]) : testing::make_fp8(rng, n, k, kind);
      PreparedLinear w = prepare::prepare_fp8(l.weight.view(), l.scale.view(), block, "fp8");
      check_bf16_rule(w, n, k, l.w, rounded_to_bf16(l.w), ms,
                      [k = k](int64_t m) { return k % 16 == 0 && m > 4; }, rng);
    }
    const Layer dense = testing::make_dense(rng, n, k, core::DType::BF16);
    for (bool int8 : {false, true}) {
      SCOPED_TRACE(int8 ? "int8 rows" : "fp8 rows");
      PreparedLinear w = int8 ? prepare::prepare_dense_as_int8_rows(dense.weight.view(), "lm_head")
                              : prepare::prepare_dense_as_fp8_rows(dense.weight.view(), "lm_head");
      const std::vector<double> copy = expected_copy(dense, int8);
      check_bf16_rule(w, n, k, copy, rounded_to_bf16(copy), ms, [k = k](int64_t m) { return k % 16 == 0 && m > 4; }, rng);
    }
  }
}

}  // namespace
}  // namespace fp4serve::kernels
