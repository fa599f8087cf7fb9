// SPDX-License-Identifier: Apache-2.0
// The AMX bf16 GEMM (gemm_amx.cpp; linear.h AmxUse) against float64: y must be Σ bf16(x)·w with the fp32 bound of
// linear_test.cpp, |y − y64| ≤ (K + 4)·2^−24·Σ|bf16(x)·w|, on the rounded x. Where the CPU has no AMX the driver
// runs on emulated tiles (each tile instruction done in C++ per the Intel SDM), which checks its blocking,
// padding and tile addressing: K past one 256-column block and with a 16-column tail (K % 32 = 16), N past whole
// 32-row panels, m past whole 16-row tiles and 32-row blocks. The hardware test runs the same cases where AMX is
// usable (amx_status) and is skipped, with the reason, elsewhere.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu/kernels/gemm_shared.h"
#include "backends/cpu/kernels/linear.h"
#include "backends/cpu/kernels/linear_check.h"
#include "backends/cpu/prepare/repack.h"
#include "core/threading.h"
#include "quant/checkpoint_tensors.h"
#include "quant/formats.h"

namespace fp4serve::kernels {
namespace {

using prepare::PreparedLinear;
using testing::Layer;

constexpr int64_t kAmxMs[] = {9, 16, 17, 33, 47, 64};

struct AmxUseScope {
  explicit AmxUseScope(AmxUse use) { set_amx_use(use); }
  ~AmxUseScope() { set_amx_use(AmxUse::Hardware); }
};

using testing_util::rounded_to_bf16;

struct Case {
  enum Kind { kNvfp4Divisor, kNvfp4Multiplier, kMxfp4, kDenseBf16, kFp8Channel, kFp8Block, kInt8Rows, kInt4 } kind;
  int64_t n, k;
};

// Builds the layer of each case (with a bias on two of three) and runs `body(w, layer, bias, rng)`.
template <class Body>
void for_each_case(Body&& body) {
  std::mt19937 rng(401);
  const Case cases[] = {{Case::kNvfp4Divisor, 13, 48},    {Case::kNvfp4Divisor, 72, 544},
                        {Case::kNvfp4Multiplier, 40, 1040}, {Case::kMxfp4, 37, 96},
                        {Case::kMxfp4, 64, 800},           {Case::kDenseBf16, 45, 272},
                        {Case::kDenseBf16, 96, 80},        {Case::kFp8Channel, 45, 272},
                        {Case::kFp8Block, 70, 400},         {Case::kInt8Rows, 33, 528},
                        {Case::kInt4, 45, 544},            {Case::kInt4, 24, 96}};
  int index = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << index << " N " << c.n << " K " << c.k);
    Layer l;
    PreparedLinear w;
    switch (c.kind) {
      case Case::kNvfp4Divisor:
      case Case::kNvfp4Multiplier: {
        const bool divisor = c.kind == Case::kNvfp4Divisor;
        l = testing::make_nvfp4(rng, c.n, c.k, divisor);
        w = prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                   divisor ? prepare::GlobalScaleConvention::Divisor
                                           : prepare::GlobalScaleConvention::Multiplier, "t");
        break;
      }
      case Case::kMxfp4:
        l = testing::make_mxfp4(rng, c.n, c.k);
        w = prepare::prepare_mxfp4(l.weight.view(), l.scale.view(), "t");
        break;
      case Case::kDenseBf16:
        l = testing::make_dense(rng, c.n, c.k, core::DType::BF16);
        w = prepare::prepare_dense(l.weight.view(), "lm_head");
        break;
      case Case::kFp8Channel:
      case Case::kFp8Block: {
        const bool block = c.kind == Case::kFp8Block;
        l = block ? testing::make_fp8(rng, c.n, c.k, 2, 128, 128) : testing::make_fp8(rng, c.n, c.k, 1);
        w = prepare::prepare_fp8(l.weight.view(), l.scale.view(),
                                 block ? std::array<int64_t, 2>{128, 128} : std::array<int64_t, 2>{0, 0}, "t");
        // The panel holds e4m3 · scale rounded to bf16 (exact in float64 before the rounding).
        l.w = rounded_to_bf16(l.w);
        break;
      }
      case Case::kInt8Rows: {
        l = testing::make_dense(rng, c.n, c.k, core::DType::BF16);
        w = prepare::prepare_dense_as_int8_rows(l.weight.view(), "lm_head");
        // code · scale (the copy's rule is checked in float64 by linear_lm_head_test), rounded to bf16.
        std::vector<float> stored(l.w.size());
        dequantize(w, stored.data());
        l.w = rounded_to_bf16(std::vector<double>(stored.begin(), stored.end()));
        break;
      }
      case Case::kInt4: {
        // Asymmetric with groups of 32, then channel-wise: the panel holds (q − z)·s rounded to bf16.
        const int64_t group = c.n == 45 ? 32 : -1;
        l = testing::make_int4(rng, c.n, c.k, group, true, false);
        w = testing_util::prepare_int4_layer(l, group, true, false);
        l.w = rounded_to_bf16(l.w);
        break;
      }
    }
    w.activation_precision = prepare::ActivationPrecision::Bf16;
    std::vector<float> bias;
    if (index % 3 != 0) {  // bias on both NVFP4 conventions, MXFP4, Dense, FP8 and int4; none on cases 0, 3, 6, 9
      std::vector<uint16_t> bits(static_cast<size_t>(l.n));
      std::normal_distribution<float> dist(0.f, 0.5f);
      for (auto& b : bits) b = testing::bf16_rne(dist(rng));
      const testing::OwnedTensor t = testing::OwnedTensor::from(core::DType::BF16, {l.n}, bits);
      prepare::attach_bias(w, t.view(), "test.bias");
      for (uint16_t b : bits) bias.push_back(testing::bf16_value(b));
    }
    body(w, l, bias, rng);
    ++index;
  }
}

// The AMX driver on `use`'s tiles, called directly (it must take every case) and through linear() (which must
// route m > 8 rows to it: the same bits).
void check_amx(AmxUse use) {
  const AmxUseScope scope(use);
  for_each_case([](const PreparedLinear& w, const Layer& l, const std::vector<float>& bias, std::mt19937& rng) {
    std::normal_distribution<float> dist(0.f, 1.f);
    for (int64_t m : kAmxMs) {
      SCOPED_TRACE(::testing::Message() << "m " << m);
      std::vector<float> x(static_cast<size_t>(m * l.k));
      for (auto& v : x) v = dist(rng) + 1e-3f;
      std::vector<float> y(static_cast<size_t>(m * l.n), std::numeric_limits<float>::quiet_NaN());
      ASSERT_TRUE(amx_bf16_gemm(w, x.data(), m, y.data()));
      testing_util::check_against_float64(l, bias, rounded_to_bf16(x), m, y);
      std::vector<float> via_linear(y.size(), std::numeric_limits<float>::quiet_NaN());
      linear(w, x.data(), m, via_linear.data());
      for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(via_linear[i], y[i]) << "linear() did not run the AMX driver";
    }
  });
}

bool bf16_panel_here() { return bf16_dot_active(); }  // the AVX-512 target with AVX512-BF16 (the x rounding)

// Int4 has no GEMV, so linear() sends its decode rows under bf16 to the AMX driver too, act-ordered layers with x
// permuted first: the same bits as the driver on the permuted x, and the float64 bound on the original x.
TEST(LinearAmx, Int4DecodeRowsAndActOrderTakeTheTiles) {
  if (!bf16_panel_here()) GTEST_SKIP() << "needs the AVX-512 target and AVX512-BF16 (the AMX driver's x rounding)";
  const AmxUseScope scope(AmxUse::Emulated);
  std::mt19937 rng(404);
  Layer l = testing::make_int4(rng, 29, 256, 32, true, true);
  PreparedLinear w = testing_util::prepare_int4_layer(l, 32, true, true);
  w.activation_precision = prepare::ActivationPrecision::Bf16;
  l.w = rounded_to_bf16(l.w);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t m : {1, 3, 12}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    std::vector<float> x(static_cast<size_t>(m * l.k)), permuted(x.size());
    for (auto& v : x) v = dist(rng) + 1e-3f;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < l.k; ++j) {
        permuted[static_cast<size_t>(i * l.k + j)] = x[static_cast<size_t>(i * l.k + w.k_perm[static_cast<size_t>(j)])];
      }
    }
    std::vector<float> y(static_cast<size_t>(m * l.n), std::numeric_limits<float>::quiet_NaN()), direct(y);
    linear(w, x.data(), m, y.data());
    testing_util::check_against_float64(l, {}, rounded_to_bf16(x), m, y);
    ASSERT_TRUE(amx_bf16_gemm(w, permuted.data(), m, direct.data()));
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], direct[i]) << "linear() did not run the AMX driver";
  }
}

TEST(LinearAmx, EmulatedTilesMatchFloat64OnBf16RoundedX) {
  if (!bf16_panel_here()) GTEST_SKIP() << "needs the AVX-512 target and AVX512-BF16 (the AMX driver's x rounding)";
  check_amx(AmxUse::Emulated);
}

TEST(LinearAmx, HardwareTilesMatchFloat64WhereTheCpuHasAmx) {
  if (!amx_status().usable) GTEST_SKIP() << "AMX: " << amx_status().reason;
  ASSERT_TRUE(amx_active());
  check_amx(AmxUse::Hardware);
}

// Each output block is summed by one thread in one K order, so the thread count changes no bit.
TEST(LinearAmx, OneAndTwoThreadsGiveIdenticalResults) {
  if (!bf16_panel_here()) GTEST_SKIP() << "needs the AVX-512 target and AVX512-BF16 (the AMX driver's x rounding)";
  const AmxUseScope scope(amx_status().usable ? AmxUse::Hardware : AmxUse::Emulated);
  std::mt19937 rng(402);
  const Layer l = testing::make_nvfp4(rng, 200, 512, true);
  PreparedLinear w = prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                            prepare::GlobalScaleConvention::Divisor, "t");
  w.activation_precision = prepare::ActivationPrecision::Bf16;
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t m = 40;
  std::vector<float> x(static_cast<size_t>(m * l.k));
  for (auto& v : x) v = dist(rng);
  std::vector<float> one(static_cast<size_t>(m * l.n)), two(one.size());
  const int threads = core::num_threads();
  core::set_num_threads(1);
  ASSERT_TRUE(amx_bf16_gemm(w, x.data(), m, one.data()));
  core::set_num_threads(2);
  ASSERT_TRUE(amx_bf16_gemm(w, x.data(), m, two.data()));
  core::set_num_threads(threads);
  for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(one[i], two[i]) << i;
}

// Off, and the layers without a bf16 panel (f32 Dense, FP8 and int4 with K not a multiple of 16), are declined: the
// caller keeps its kernels.
TEST(LinearAmx, DeclinesWhenOffOrWithoutABf16Panel) {
  std::mt19937 rng(403);
  const Layer l = testing::make_nvfp4(rng, 16, 64, true);
  PreparedLinear w = prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                            prepare::GlobalScaleConvention::Divisor, "t");
  std::vector<float> x(static_cast<size_t>(16 * 64), 0.5f), y(static_cast<size_t>(16 * 16), -1.f);
  {
    const AmxUseScope scope(AmxUse::Off);
    EXPECT_FALSE(amx_bf16_gemm(w, x.data(), 16, y.data()));
    EXPECT_FALSE(amx_active());
  }
  const AmxUseScope scope(AmxUse::Emulated);
  const Layer f32 = testing::make_dense(rng, 16, 64, core::DType::F32);
  const PreparedLinear dense = prepare::prepare_dense(f32.weight.view(), "t");
  EXPECT_FALSE(amx_bf16_gemm(dense, x.data(), 16, y.data()));
  const Layer f8 = testing::make_fp8(rng, 16, 40, 1);
  const PreparedLinear fp8 = prepare::prepare_fp8(f8.weight.view(), f8.scale.view(), {0, 0}, "t");
  EXPECT_FALSE(amx_bf16_gemm(fp8, x.data(), 16, y.data()));
  const Layer i4 = testing::make_int4(rng, 16, 40, -1, false, false);
  const PreparedLinear int4 = testing_util::prepare_int4_layer(i4, -1, false, false);
  EXPECT_FALSE(amx_bf16_gemm(int4, x.data(), 16, y.data()));
  for (float v : y) ASSERT_EQ(v, -1.f) << "a declined call wrote y";
}

// The micro-step check that amx_status's probe runs on the hardware must hold on the emulated tiles, exactly.
TEST(LinearAmx, ProbesMicroStepCheckHoldsOnEmulatedTiles) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
  EXPECT_TRUE(amx_tile_step_check_emulated());
#else
  GTEST_SKIP() << "the AMX kernel is built for x86-64 GCC only";
#endif
}

TEST(LinearAmx, StatusGivesAReason) {
  const AmxStatus& s = amx_status();
  EXPECT_FALSE(s.reason.empty());
  if (!s.usable) {
    EXPECT_FALSE(amx_active());
  }
}

}  // namespace
}  // namespace fp4serve::kernels
