// SPDX-License-Identifier: Apache-2.0
// linear() for every layout, on every compiled SIMD target, against float64 references computed in the tests
// from the checkpoint tensors (tests/prepare/checkpoint_tensors.h). Outputs are poisoned with NaN first.
//
// Error bound (all layouts): every prepared weight decodes to its exact value in fp32 (E2M1·E4M3, E2M1·2^e,
// (q−z)·bf16, E4M3·bf16 and bf16/f16 products all fit in 24 bits), so the only error is fp32 accumulation
// over K plus the global-scale and bias roundings: |y − y64| ≤ (K + 4)·2^−24·(Σ|x·w| + |bias|). Small K keeps
// the bound far below the effect of one wrong weight (≈ Σ|x·w| / K).
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>

#include "backends/cpu/kernels/gemm_shared.h"
#include "backends/cpu/kernels/linear.h"
#include "backends/cpu/kernels/linear_check.h"
#include "core/threading.h"
#include "fp4serve/error.h"
#include "quant/checkpoint_tensors.h"
#include "backends/cpu/prepare/repack.h"
#include "quant/formats.h"

namespace fp4serve::kernels {
namespace {

using prepare::GlobalScaleConvention;
using prepare::PreparedLinear;
using testing::Layer;
using testing::OwnedTensor;

// 1..4 run the fused NVFP4/MXFP4 GEMV on AVX2, NEON and SVE, 1..8 on AVX-512 (gemv_max_rows), 5..8 the
// streaming panel path on AVX2 / NEON / SVE, 9 on AVX-512, 33 the blocked panel path.
constexpr int64_t kMs[] = {1, 2, 3, 4, 5, 8, 9, 33};

// Runs `body` once per compiled SIMD target supported by this CPU, and on a target whose fused GEMV takes
// AVX512-BF16 pairs (bf16_dot_active) once more with them switched off (the FMA kernel).
void for_each_target(const std::function<void()>& body) {
  const auto targets = gemm_targets();
  ASSERT_FALSE(targets.empty());
  for (int64_t t : targets) {
    hwy::SetSupportedTargetsForTest(t);
    SCOPED_TRACE(hwy::TargetName(t));
    ASSERT_STREQ(gemm_target_name(), hwy::TargetName(t));
    body();
    if (bf16_dot_active()) {
      set_bf16_dot_allowed(false);
      SCOPED_TRACE("bf16 pairs off");
      ASSERT_FALSE(bf16_dot_active());
      body();
      set_bf16_dot_allowed(true);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The error term the bf16-pair GEMV adds when it serves linear(w, ·, m) now: x carried as two bf16,
// |x − hi − lo| ≤ 2^−17·|x| (backends/cpu/kernels/linear.h set_bf16_dot_allowed), so 2^−17·Σ|x·w|.
double pair_term(const PreparedLinear& w, int64_t m) {
  const bool served = w.layout == prepare::WeightLayout::Fp4 &&
                      w.activation_precision == prepare::ActivationPrecision::Fp32 && m >= 1 &&
                      m <= gemv_max_rows() && bf16_dot_active();
  return served ? 0x1p-17 : 0.0;
}

std::vector<float> random_x(std::mt19937& rng, int64_t m, int64_t k) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (auto& v : x) v = dist(rng);
  return x;
}

// max over y [m, N] of |y − Σ x·w| / Σ |x·w| on the exact x and the layer's exact weights: above the fp32 bound
// wherever the kernel provably rounded x (or the weights) to bf16.
double worst_vs_exact(const Layer& l, const std::vector<float>& x, int64_t m, const std::vector<float>& y) {
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t n = 0; n < l.n; ++n) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < l.k; ++k) {
        const double p = x[static_cast<size_t>(i * l.k + k)] * l.w[static_cast<size_t>(n * l.k + k)];
        ref += p;
        mag += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(y[static_cast<size_t>(i * l.n + n)] - ref) / mag);
    }
  }
  return worst;
}

using testing_util::check_against_float64;

// Runs linear (all targets, every m) and linear_reference on `w` and checks both.
void check_layer(PreparedLinear& w, const Layer& l, std::mt19937& rng, bool with_bias = true) {
  std::vector<float> bias;
  if (with_bias) {
    std::vector<uint16_t> bits(static_cast<size_t>(l.n));
    std::normal_distribution<float> dist(0.f, 0.5f);
    for (auto& b : bits) b = testing::bf16_rne(dist(rng));
    const OwnedTensor t = OwnedTensor::from(core::DType::BF16, {l.n}, bits);
    prepare::attach_bias(w, t.view(), "test.bias");
    for (uint16_t b : bits) bias.push_back(testing::bf16_value(b));
  }
  for (int64_t m : kMs) {
    const auto x = random_x(rng, m, l.k);
    std::vector<float> y(static_cast<size_t>(m * l.n));
    for_each_target([&] {
      std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
      linear(w, x.data(), m, y.data());
      check_against_float64(l, bias, x, m, y, pair_term(w, m));
    });
    std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
    linear_reference(w, x.data(), m, y.data());
    SCOPED_TRACE("linear_reference");
    check_against_float64(l, bias, x, m, y);
  }
}

TEST(LinearNvfp4, AllTargetsMatchFloat64) {
  std::mt19937 rng(101);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 16}, {13, 48}, {37, 544}}) {
    for (bool divisor : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "N " << n << " K " << k << " divisor " << divisor);
      const Layer l = testing::make_nvfp4(rng, n, k, divisor);
      PreparedLinear w = prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                                divisor ? GlobalScaleConvention::Divisor : GlobalScaleConvention::Multiplier, "t");
      check_layer(w, l, rng, n != 1);
    }
  }
}

TEST(LinearMxfp4, AllTargetsMatchFloat64) {
  std::mt19937 rng(102);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 32}, {13, 96}, {37, 544}}) {
    SCOPED_TRACE(::testing::Message() << "N " << n << " K " << k);
    const Layer l = testing::make_mxfp4(rng, n, k);
    PreparedLinear w = prepare::prepare_mxfp4(l.weight.view(), l.scale.view(), "t");
    check_layer(w, l, rng);
  }
}

TEST(LinearInt4, AllTargetsMatchFloat64) {
  std::mt19937 rng(103);
  struct Case { int64_t n, k, group; bool asym, actorder; };
  for (const Case c : {Case{1, 32, 32, false, false}, Case{13, 64, 32, true, false}, Case{37, 512, 128, true, true},
                       Case{11, 40, -1, false, false}}) {
    SCOPED_TRACE(::testing::Message() << "N " << c.n << " K " << c.k << " group " << c.group << " asym " << c.asym
                                      << " actorder " << c.actorder);
    const Layer l = testing::make_int4(rng, c.n, c.k, c.group, c.asym, c.actorder);
    PreparedLinear w = testing_util::prepare_int4_layer(l, c.group, c.asym, c.actorder);
    check_layer(w, l, rng);
  }
}

// ActivationPrecision::Bf16 on int4 layers: where AVX512-BF16 dot products run (the AVX-512 target), x rounded to
// bf16 times the weights (q − z)·s rounded to bf16, as a bf16 dequantization gives them, at every m (int4 has no
// GEMV of its own: the bf16 panel GEMM serves decode rows too); elsewhere fp32 x on the exact weights. Groups of
// 32 and 128 and channel-wise, symmetric and asymmetric, act order (x permuted before the panel), N ending in a
// lone tile, K past one 256-column panel chunk, a partial last group (544 = 4·128 + 32), and K = 40 (not a multiple
// of 16: fp32 x everywhere). Under Bf16DecodeInt8 a layer the int8 kernel cannot take (groups of 24) runs bf16 on
// the decode rows and keeps fp32 x above them. The result must also differ from the exact one where bf16 ran, so
// the roundings provably happened.
TEST(LinearInt4, Bf16PrecisionTakesBf16DotsOnBf16Weights) {
  std::mt19937 rng(107);
  struct Case {
    int64_t n, k, group;
    bool asym, actorder;
    prepare::ActivationPrecision precision = prepare::ActivationPrecision::Bf16;
  };
  for (const Case c : {Case{13, 64, 32, true, false}, Case{37, 544, 32, false, false}, Case{45, 512, 128, true, true},
                       Case{21, 544, 128, true, false}, Case{9, 80, -1, true, false}, Case{7, 528, -1, false, false},
                       Case{11, 40, -1, false, false},
                       Case{19, 96, 24, true, false, prepare::ActivationPrecision::Bf16DecodeInt8}}) {
    SCOPED_TRACE(::testing::Message() << "N " << c.n << " K " << c.k << " group " << c.group << " asym " << c.asym
                                      << " actorder " << c.actorder << " "
                                      << prepare::activation_precision_name(c.precision));
    const Layer l = testing::make_int4(rng, c.n, c.k, c.group, c.asym, c.actorder);
    PreparedLinear w = testing_util::prepare_int4_layer(l, c.group, c.asym, c.actorder);
    w.activation_precision = c.precision;
    Layer rounded_w;  // check_against_float64 reads n, k and w
    rounded_w.n = l.n;
    rounded_w.k = l.k;
    rounded_w.w = testing_util::rounded_to_bf16(l.w);
    for (int64_t m : {1, 3, 5, 9, 33}) {
      SCOPED_TRACE(::testing::Message() << "m " << m);
      const auto x = random_x(rng, m, l.k);
      const std::vector<float> rounded_x = testing_util::rounded_to_bf16(x);
      std::vector<float> y(static_cast<size_t>(m * l.n));
      testing_util::for_each_target([&] {
        const bool bf16 = bf16_dot_active() && c.k % 16 == 0 &&
                          precision_for_rows(c.precision, m) == prepare::ActivationPrecision::Bf16;
        std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
        linear(w, x.data(), m, y.data());
        testing_util::check_against_float64(bf16 ? rounded_w : l, {}, bf16 ? rounded_x : x, m, y);
        if (!bf16) return;
        EXPECT_GT(worst_vs_exact(l, x, m, y), static_cast<double>(l.k + 4) * 0x1p-24)
            << "x and the weights were not rounded";
      });
    }
  }
}

TEST(LinearFp8, AllTargetsMatchFloat64) {
  std::mt19937 rng(104);
  struct Case { int64_t n, k; int kind; int64_t bh, bw; };
  // K = 301 with 128-column blocks ends in an odd partial block; 5-column blocks are odd (the AVX-512 GEMV's column
  // pairs then give way to single columns).
  for (const Case c : {Case{1, 1, 0, 0, 0}, Case{13, 37, 1, 0, 0}, Case{37, 300, 2, 16, 128}, Case{19, 301, 2, 16, 128},
                       Case{9, 21, 2, 8, 5}}) {
    SCOPED_TRACE(::testing::Message() << "N " << c.n << " K " << c.k << " kind " << c.kind);
    const Layer l = testing::make_fp8(rng, c.n, c.k, c.kind, c.bh, c.bw);
    PreparedLinear w = prepare::prepare_fp8(l.weight.view(), l.scale.view(), {c.bh, c.bw}, "t");
    check_layer(w, l, rng);
  }
}

TEST(LinearDense, AllTargetsMatchFloat64) {
  std::mt19937 rng(105);
  for (core::DType d : {core::DType::BF16, core::DType::F16, core::DType::F32}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {13, 29}, {37, 300}}) {
      SCOPED_TRACE(::testing::Message() << "N " << n << " K " << k << " dtype " << core::dtype_name(d));
      const Layer l = testing::make_dense(rng, n, k, d);
      PreparedLinear w = prepare::prepare_dense(l.weight.view(), "t");
      check_layer(w, l, rng);
    }
  }
}

// The fused small-m GEMV, called directly so a silent fallback to the panel GEMM cannot hide a broken fused
// path: it must accept NVFP4/MXFP4 with m = 1..4 on AVX2 and 1..8 on AVX-512 (and nothing else) and match
// float64.
// Shapes: odd N (one tile, an odd number of tiles — read twice as a pair on AVX-512 — and a partial last
// tile) and K at the smallest legal multiple (one scale group) up to several groups.
TEST(LinearFusedGemv, SmallMMatchesFloat64OnEverySimdTarget) {
  std::mt19937 rng(108);
  struct Case { bool nvfp4; int64_t n, k; };
  for (const Case c : {Case{true, 1, 16}, Case{true, 13, 16}, Case{true, 37, 48}, Case{true, 19, 400},
                       Case{false, 1, 32}, Case{false, 13, 32}, Case{false, 37, 96}, Case{false, 23, 416}}) {
    SCOPED_TRACE(::testing::Message() << (c.nvfp4 ? "nvfp4" : "mxfp4") << " N " << c.n << " K " << c.k);
    const Layer l = c.nvfp4 ? testing::make_nvfp4(rng, c.n, c.k, c.n % 2 == 1) : testing::make_mxfp4(rng, c.n, c.k);
    PreparedLinear w = c.nvfp4 ? prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                                        c.n % 2 == 1 ? GlobalScaleConvention::Divisor
                                                                     : GlobalScaleConvention::Multiplier, "t")
                               : prepare::prepare_mxfp4(l.weight.view(), l.scale.view(), "t");
    std::vector<uint16_t> bits(static_cast<size_t>(l.n));
    std::normal_distribution<float> dist(0.f, 0.5f);
    for (auto& b : bits) b = testing::bf16_rne(dist(rng));
    const OwnedTensor bias_tensor = OwnedTensor::from(core::DType::BF16, {l.n}, bits);
    prepare::attach_bias(w, bias_tensor.view(), "test.bias");
    std::vector<float> bias;
    for (uint16_t b : bits) bias.push_back(testing::bf16_value(b));
    for (int64_t m = 0; m <= 9; ++m) {
      const auto x = random_x(rng, m, l.k);
      std::vector<float> y(static_cast<size_t>(m * l.n));
      for_each_target([&] {
        const std::string target = gemm_target_name();
        const bool arm = target == "NEON" || target == "SVE" || target == "SVE_256" || target == "SVE2" || target == "SVE2_128";
        const int64_t max_rows = target == "AVX2" || arm ? 4 : target == "AVX3" || target == "AVX3_DL" ? 8 : 0;
        EXPECT_EQ(gemv_max_rows(), max_rows);
        std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
        const bool fused = gemv_dispatch(w, x.data(), m, y.data());
        EXPECT_EQ(fused, m >= 1 && m <= max_rows) << "m " << m;
        if (fused) check_against_float64(l, bias, x, m, y, pair_term(w, m));
      });
    }
  }
}

TEST(LinearFusedGemv, OtherLayoutsAreNotClaimed) {
  std::mt19937 rng(109);
  const Layer l = testing::make_int4(rng, 13, 64, 32, true, false);
  const core::TensorView zp = l.zero_point.view();
  const PreparedLinear w = prepare::prepare_int4(l.weight.view(), l.scale.view(), &zp, nullptr, l.k, 32, "t");
  const auto x = random_x(rng, 1, l.k);
  std::vector<float> y(static_cast<size_t>(l.n), std::numeric_limits<float>::quiet_NaN());
  for_each_target([&] {
    EXPECT_FALSE(gemv_dispatch(w, x.data(), 1, y.data()));
    for (float v : y) EXPECT_TRUE(std::isnan(v));  // nothing written
  });
}

// Scale byte i of an MXFP4 test layer (make_mxfp4 sets byte 1 to 1, i.e. 2^-126), with the float64 weights.
void set_mx_scale(Layer& l, size_t i, uint8_t byte) {
  auto* scales = reinterpret_cast<uint8_t*>(l.scale.data.data());
  const auto* codes = reinterpret_cast<const uint8_t*>(l.weight.data.data());
  scales[i] = byte;
  const int64_t groups = l.k / 32;
  const int64_t r = static_cast<int64_t>(i) / groups, g = static_cast<int64_t>(i) % groups;
  for (int64_t c = 32 * g; c < 32 * (g + 1); ++c) {
    const uint8_t b = codes[static_cast<size_t>(r * l.k / 2 + c / 2)];
    l.w[static_cast<size_t>(r * l.k + c)] = testing::e2m1_value(c % 2 == 0 ? b & 0xF : b >> 4) * std::ldexp(1.0, byte - 127);
  }
}

// ActivationPrecision::Bf16: y must be Σ bf16(x)·w (float64 on the rounded x, the file's fp32 bound), on every
// target and with bf16 dot products on and off, through the GEMV (m ≤ 8), the streaming panel (9) and the blocked
// panel (13, 33), for K past one 256-column panel chunk, N a multiple of 8 and not (a lone last tile in a pair,
// tiles past the end of the last panel). MXFP4 scale byte 2 makes the smallest weights that stay normal bf16; byte
// 1 makes 2^−127 … 3·2^−126, which vdpbf16ps reads as 0 (within the bound's 1e-30). It must also differ from the
// exact-x result, so the rounding provably happened.
TEST(LinearBf16, MatchesFloat64OnBf16RoundedX) {
  std::mt19937 rng(110);
  struct Case { bool nvfp4; int64_t n, k; int mx_byte; };
  for (const Case c : {Case{true, 13, 48, 0}, Case{true, 37, 400, 0}, Case{true, 72, 544, 0}, Case{false, 23, 96, 120},
                       Case{false, 40, 544, 2}, Case{false, 72, 320, 1}, Case{false, 37, 544, 124}}) {
    SCOPED_TRACE(::testing::Message() << (c.nvfp4 ? "nvfp4" : "mxfp4") << " N " << c.n << " K " << c.k << " byte "
                                      << c.mx_byte);
    Layer l = c.nvfp4 ? testing::make_nvfp4(rng, c.n, c.k, true) : testing::make_mxfp4(rng, c.n, c.k);
    if (!c.nvfp4) set_mx_scale(l, 1, static_cast<uint8_t>(c.mx_byte));
    PreparedLinear w = c.nvfp4 ? prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                                        GlobalScaleConvention::Divisor, "t")
                               : prepare::prepare_mxfp4(l.weight.view(), l.scale.view(), "t");
    w.activation_precision = prepare::ActivationPrecision::Bf16;
    for (int64_t m : {1, 2, 5, 8, 9, 13, 33}) {
      const auto x = random_x(rng, m, l.k);
      const std::vector<float> rounded = testing_util::rounded_to_bf16(x);
      std::vector<float> y(static_cast<size_t>(m * l.n));
      for_each_target([&] {
        std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
        linear(w, x.data(), m, y.data());
        check_against_float64(l, {}, rounded, m, y);
        EXPECT_GT(worst_vs_exact(l, x, m, y), static_cast<double>(l.k + 4) * 0x1p-24) << "m " << m << ": x was not rounded";
      });
    }
  }
}

TEST(LinearThreads, OneAndTwoThreadsGiveIdenticalResults) {
  std::mt19937 rng(106);
  const Layer l = testing::make_nvfp4(rng, 45, 256, true);
  const PreparedLinear w = prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale, GlobalScaleConvention::Divisor, "t");
  for (int64_t m : kMs) {
    const auto x = random_x(rng, m, l.k);
    std::vector<float> y1(static_cast<size_t>(m * l.n)), y2(y1.size());
    core::set_num_threads(1);
    linear(w, x.data(), m, y1.data());
    core::set_num_threads(2);
    EXPECT_EQ(core::num_threads(), 2);
    linear(w, x.data(), m, y2.data());
    core::set_num_threads(0);
    EXPECT_EQ(y1, y2) << "m " << m;  // each output is summed by one thread in a fixed order
  }
}

// The dispatch runs a SIMD target whenever one is compiled and supported, never the scalar fallback (the line
// printed here is what `make test-arm` shows per qemu CPU model). Which SIMD target is Highway's choice: 1.0.3
// prefers SVE over SVE_256 on a 256-bit SVE CPU; every target is still tested by for_each_target above.
TEST(LinearTargets, DispatchRunsASupportedSimdTarget) {
  const auto targets = gemm_targets();
  ASSERT_FALSE(targets.empty());
  std::string names;
  bool listed = false;
  for (int64_t t : targets) {
    names += std::string(" ") + hwy::TargetName(t);
    listed = listed || std::string(hwy::TargetName(t)) == gemm_target_name();
  }
  std::printf("[  target  ] linear() dispatches to %s (AVX512-BF16 pair GEMV: %s); compiled and supported:%s\n",
              gemm_target_name(), bf16_dot_active() ? "yes" : "no", names.c_str());
  EXPECT_TRUE(listed) << gemm_target_name();
  const auto scalar = [](const std::string& name) { return name == "EMU128" || name == "SCALAR"; };
  if (!scalar(hwy::TargetName(targets.front()))) {
    EXPECT_FALSE(scalar(gemm_target_name())) << names;
  }
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  // A CPU with AVX512-BF16 runs the bf16-pair GEMV, so the tests above reach it (and its FMA fallback).
  if (std::string(gemm_target_name()) == "AVX3") {
    EXPECT_EQ(bf16_dot_active(), __builtin_cpu_supports("avx512bf16") != 0);
  }
#endif
#if defined(__aarch64__)
  // Every AArch64 CPU has NEON, so its GEMM must be compiled in.
  EXPECT_NE(names.find(" NEON"), std::string::npos) << names;
#endif
}

TEST(LinearErrors, BadArgumentsThrowUsageError) {
  std::mt19937 rng(107);
  const Layer l = testing::make_mxfp4(rng, 4, 32);
  const PreparedLinear w = prepare::prepare_mxfp4(l.weight.view(), l.scale.view(), "t");
  std::vector<float> x(32, 1.f), y(4);
  EXPECT_THROW(linear(w, x.data(), -1, y.data()), UsageError);
  EXPECT_THROW(linear(w, nullptr, 1, y.data()), UsageError);
  EXPECT_NO_THROW(linear(w, nullptr, 0, nullptr));
  EXPECT_THROW(linear(w, x.data(), 1, y.data(), ActivationEmulation::EmulateNvfp4), UsageError);
  EXPECT_THROW(core::set_num_threads(-2), UsageError);
}

}  // namespace
}  // namespace fp4serve::kernels
