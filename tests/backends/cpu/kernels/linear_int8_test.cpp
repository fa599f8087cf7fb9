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

#include "backends/cpu/kernels/gemm_shared.h"
#include "backends/cpu/kernels/linear.h"
#include "backends/cpu/kernels/linear_check.h"
#include "fp4serve/error.h"
#include "quant/checkpoint_tensors.h"
#include "backends/cpu/prepare/repack.h"

namespace fp4serve::kernels {
namespace {

using prepare::ActivationPrecision;
using prepare::PreparedLinear;
using testing::Layer;

// 1..4 one pass of the AVX2 kernel, 1..8 of the AVX-512 one; 5, 9, 17 several passes (chunks of rows).
constexpr int64_t kInt8Ms[] = {1, 2, 3, 4, 5, 8, 9, 17};

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
std::vector<float> random_x_with_outliers(std::mt19937& rng, int64_t m, int64_t k) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (size_t i = 0; i < x.size(); ++i) {
    float v = dist(rng);
    if (v == 0.f) v = 0.25f;
    x[i] = (i / 16) % 8 == 3 ? 50.f * v : v;
  }
  return x;
}

// x ≈ (256·q + r)·d in every block.
int big_q(const std::vector<int8_t>& q, const std::vector<int8_t>& r, size_t at) { return 256 * q[at] + r[at]; }

TEST(QuantizeActivationsInt8, FollowsTheRuleInFloat64) {
  std::mt19937 rng(7);
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t block : {16, 32}) {
    for (float ratio : {0.f, 0.5f, 1.f, 1.7f, inf}) {
      SCOPED_TRACE(::testing::Message() << "block " << block << " fine_ratio " << ratio);
      const int64_t m = 3, k = 7 * block;
      auto x = random_x_with_outliers(rng, m, k);
      for (int64_t j = 0; j < block; ++j) x[static_cast<size_t>(k + j)] = 0.f;  // row 1, group 0: all zero
      std::vector<int8_t> q(static_cast<size_t>(m * k), 99), r(static_cast<size_t>(m * k), 99);
      std::vector<float> d(static_cast<size_t>(m * k / block), -1.f);
      std::vector<uint8_t> flags(static_cast<size_t>(m * k / block), 99);
      for_each_int8_target([&] {
        quantize_activations_int8(x.data(), m, k, block, ratio, q.data(), r.data(), d.data(), flags.data());
        int64_t fine_blocks = 0, coarse_blocks = 0;
        for (int64_t i = 0; i < m; ++i) {
          std::vector<double> amax(static_cast<size_t>(k / block), 0.0);
          double mean_d2 = 0;
          int64_t usable = 0;
          for (int64_t g = 0; g < k / block; ++g) {
            for (int64_t j = 0; j < block; ++j) {
              amax[static_cast<size_t>(g)] =
                  std::max(amax[static_cast<size_t>(g)], std::fabs(static_cast<double>(x[static_cast<size_t>(i * k + g * block + j)])));
            }
            if (amax[static_cast<size_t>(g)] > 0) {
              mean_d2 += std::pow(amax[static_cast<size_t>(g)] / 127, 2);
              ++usable;
            }
          }
          mean_d2 /= static_cast<double>(usable);
          for (int64_t g = 0; g < k / block; ++g) {
            const double a = amax[static_cast<size_t>(g)];
            const double dg = d[static_cast<size_t>(i * (k / block) + g)];
            const double margin = std::pow(a / 127, 2) / (static_cast<double>(ratio) * ratio * mean_d2);
            ASSERT_LE(flags[static_cast<size_t>(i * (k / block) + g)], 1);
            const bool fine = flags[static_cast<size_t>(i * (k / block) + g)] == 1;
            ASSERT_NEAR(dg, a / 32512, a / 32512 * 1e-7) << "row " << i << " group " << g;
            if (a > 0 && std::isfinite(margin) && std::fabs(margin - 1) > 1e-5) {
              ASSERT_EQ(fine, margin > 1) << "row " << i << " group " << g << ": (a/127)² / (ratio² mean) = " << margin;
            }
            if (a > 0 && ratio == 0.f) {
              ASSERT_TRUE(fine) << "fine_ratio 0: every block is fine";
            }
            if (ratio == inf) {
              ASSERT_FALSE(fine) << "fine_ratio inf: Q8_0 everywhere";
            }
            if (a > 0) (fine ? fine_blocks : coarse_blocks)++;
            const double top = fine ? 32512 : 127;
            bool full = a == 0;
            for (int64_t j = 0; j < block; ++j) {
              const size_t at = static_cast<size_t>(i * k + g * block + j);
              ASSERT_LE(std::abs(static_cast<int>(q[at])), 127);
              if (!fine) {
                ASSERT_EQ(r[at], 0) << "coarse blocks have no low byte";
              }
              const int qv = fine ? big_q(q, r, at) : q[at];  // on the grid of top/a
              if (a == 0) {
                ASSERT_EQ(qv, 0);
                continue;
              }
              // x · top/a in float64 against Q: one rounding to nearest, plus the fp32 product's ulps.
              ASSERT_LE(std::fabs(qv - x[at] * top / a), 0.5 + top * 0x1p-22) << "x " << x[at] << " row " << i << " col " << g * block + j;
              full = full || std::abs(qv) == static_cast<int>(top);
            }
            ASSERT_TRUE(full) << "the largest |x| of a block maps to ±" << top;
          }
        }
        if (ratio == 1.f) {
          // The outlier groups of random_x_with_outliers (×50) are fine, the others not: both kinds occur at the
          // default-like ratio.
          EXPECT_GT(fine_blocks, 0);
          EXPECT_GT(coarse_blocks, 0);
        }
      });
    }
  }
  EXPECT_THROW(quantize_activations_int8(nullptr, 1, 20, 16, 1.f, nullptr, nullptr, nullptr), UsageError);
  EXPECT_THROW(quantize_activations_int8(nullptr, 1, 16, 16, -1.f, nullptr, nullptr, nullptr), UsageError);
}

// linear() with Int8 against Σ x̂·w (tight) and Σ x·w (quantization bound), x̂ = Q·d from quantize_activations_int8
// with the ratio linear() uses.
// An act-order Int4 layer (w.k_perm) quantizes x in its prepared column order: x_p[j] = x[k_perm[j]], against
// column k_perm[j] of the weights.
void check_int8(PreparedLinear& w, const Layer& l, int64_t group, std::mt19937& rng,
                std::span<const int64_t> ms = kInt8Ms) {
  w.activation_precision = ActivationPrecision::Int8;
  const int64_t groups = l.k / group;
  const auto column = [&](int64_t j) { return w.k_perm.empty() ? j : int64_t{w.k_perm[static_cast<size_t>(j)]}; };
  for (int64_t m : ms) {
    const auto x_in = random_x_with_outliers(rng, m, l.k);
    std::vector<float> x(x_in.size());  // prepared column order
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < l.k; ++j) x[static_cast<size_t>(i * l.k + j)] = x_in[static_cast<size_t>(i * l.k + column(j))];
    }
    std::vector<int8_t> q(static_cast<size_t>(m * l.k)), r(static_cast<size_t>(m * l.k));
    std::vector<float> d(static_cast<size_t>(m * groups));
    std::vector<uint8_t> fine(static_cast<size_t>(m * groups));
    quantize_activations_int8(x.data(), m, l.k, group, kInt8ActivationFineRatio, q.data(), r.data(), d.data(),
                              fine.data());
    std::vector<float> y(static_cast<size_t>(m * l.n));
    for_each_int8_target([&] {
      std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
      linear(w, x_in.data(), m, y.data());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t n = 0; n < l.n; ++n) {
          double ref_q = 0, mag_q = 0, ref_x = 0, quant_bound = 0;
          for (int64_t k = 0; k < l.k; ++k) {
            const size_t xi = static_cast<size_t>(i * l.k + k);
            const double wv = l.w[static_cast<size_t>(n * l.k + column(k))];
            const double dg = d[static_cast<size_t>(i * groups + k / group)];
            const double xhat = big_q(q, r, xi) * dg;
            ref_q += xhat * wv;
            mag_q += std::fabs(xhat * wv);
            ref_x += x[xi] * wv;
            // |x − x̂| ≤ half a step: d/2 in a fine block, 128·d in a coarse one (steps of 256·d).
            quant_bound += std::fabs(wv) * dg * (fine[static_cast<size_t>(i * groups + k / group)] != 0 ? 0.5 : 128);
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

// At K = 4096 a block of passes holds one (AVX-512) or two (AVX2) passes of x, so 16 and 19 rows run several
// blocks, then a tail of 3 rows; and from 16 rows the activations are quantized in parallel. K = 14336 is a
// down projection's at hidden 4096: 115 KB of x per pass.
TEST(LinearInt8, SeveralBlocksOfPassesAtLargeK) {
  std::mt19937 rng(203);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{21, 4096}, {203, 14336}}) {
    SCOPED_TRACE(::testing::Message() << "N " << n << " K " << k);
    const Layer l = testing::make_nvfp4(rng, n, k, true);
    PreparedLinear w = prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                              prepare::GlobalScaleConvention::Divisor, "t");
    constexpr int64_t kBlockMs[] = {16, 19};
    check_int8(w, l, 16, rng, kBlockMs);
  }
}

// Int4 (GPTQ / AWQ W4A16: symmetric and with zero points, groups of 16 … 128 and channel-wise, act-order) on
// activation blocks of 16 columns, several per weight group. K = 40 channel-wise (not a multiple of 16) keeps
// fp32 x, within fp32 rounding of Σ x·w; so does a partial last group.
TEST(LinearInt8, Int4MatchesFloat64) {
  std::mt19937 rng(206);
  struct Case { int64_t n, k, group; bool asym, actorder; };
  for (const Case c : {Case{1, 32, 32, false, false}, Case{13, 64, 16, true, false}, Case{29, 384, 128, true, false},
                       Case{37, 512, 128, false, true}, Case{21, 96, -1, true, false}, Case{203, 4096, 128, true, true}}) {
    SCOPED_TRACE(::testing::Message() << "N " << c.n << " K " << c.k << " group " << c.group << " asym " << c.asym
                                      << " actorder " << c.actorder);
    const Layer l = testing::make_int4(rng, c.n, c.k, c.group, c.asym, c.actorder);
    PreparedLinear w = testing_util::prepare_int4_layer(l, c.group, c.asym, c.actorder);
    ASSERT_TRUE(int8_takes_int4(w));
    constexpr int64_t kLargeMs[] = {3, 16, 19};
    check_int8(w, l, kInt4ActivationBlock, rng, c.k >= 4096 ? std::span<const int64_t>(kLargeMs) : kInt8Ms);
  }
  // A partial last group (K = 48, group 32) is not taken either.
  const Layer partial = testing::make_int4(rng, 5, 48, 32, true, false);
  EXPECT_FALSE(int8_takes_int4(testing_util::prepare_int4_layer(partial, 32, true, false)));
  const Layer l = testing::make_int4(rng, 11, 40, -1, false, false);
  PreparedLinear w = testing_util::prepare_int4_layer(l, -1, false, false);
  ASSERT_FALSE(int8_takes_int4(w));
  w.activation_precision = ActivationPrecision::Int8;
  const int64_t m = 5;
  const auto x = random_x_with_outliers(rng, m, l.k);
  std::vector<float> y(static_cast<size_t>(m * l.n));
  linear(w, x.data(), m, y.data());
  testing_util::check_against_float64(l, {}, x, m, y);  // fp32 x
  EXPECT_THROW(int8_gemm(w, x.data(), m, y.data()), UsageError);
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

// What the fine blocks are for: rows whose error is dominated by one outlier block (RMSNorm outputs times a
// norm weight with outlier channels). Against Σ x·w in float64, linear()'s RMS error must be under a quarter of
// what the plain Q8_0 grid (fine_ratio = inf, the grid before fine blocks) gives in float64 on the same rows;
// both are computed over every output of odd-shaped NVFP4 and MXFP4 layers.
TEST(LinearInt8, FineBlocksCutTheErrorOfOutlierBlocks) {
  std::mt19937 rng(205);
  for (bool mx : {false, true}) {
    const int64_t n = 45, k = mx ? 352 : 208, group = mx ? 32 : 16, m = 3;
    SCOPED_TRACE(mx ? "mxfp4" : "nvfp4");
    const Layer l = mx ? testing::make_mxfp4(rng, n, k) : testing::make_nvfp4(rng, n, k, true);
    PreparedLinear w = mx ? prepare::prepare_mxfp4(l.weight.view(), l.scale.view(), "t")
                          : prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                                   prepare::GlobalScaleConvention::Divisor, "t");
    w.activation_precision = ActivationPrecision::Int8;
    // One outlier block (×50) per row, at a different block in each row.
    std::normal_distribution<float> dist(0.f, 1.f);
    std::vector<float> x(static_cast<size_t>(m * k));
    for (size_t at = 0; at < x.size(); ++at) {
      const int64_t i = static_cast<int64_t>(at) / k, c = static_cast<int64_t>(at) % k;
      float v = dist(rng);
      if (v == 0.f) v = 0.25f;
      x[at] = c / group == (5 * i + 1) % (k / group) ? 50.f * v : v;
    }
    std::vector<int8_t> q(static_cast<size_t>(m * k)), r(static_cast<size_t>(m * k));
    std::vector<float> d(static_cast<size_t>(m * k / group));
    quantize_activations_int8(x.data(), m, k, group, std::numeric_limits<float>::infinity(), q.data(), r.data(), d.data());
    std::vector<float> y(static_cast<size_t>(m * n));
    for_each_int8_target([&] {
      linear(w, x.data(), m, y.data());
      double err2 = 0, q8_err2 = 0;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t o = 0; o < n; ++o) {
          double ref = 0, q8 = 0;
          for (int64_t c = 0; c < k; ++c) {
            const size_t at = static_cast<size_t>(i * k + c);
            const double wv = l.w[static_cast<size_t>(o * k + c)];
            ref += x[at] * wv;
            q8 += big_q(q, r, at) * static_cast<double>(d[static_cast<size_t>(i * (k / group) + c / group)]) * wv;
          }
          err2 += std::pow(y[static_cast<size_t>(i * n + o)] - ref, 2);
          q8_err2 += std::pow(q8 - ref, 2);
        }
      }
      ASSERT_GT(q8_err2, 0);
      EXPECT_LT(std::sqrt(err2 / q8_err2), 0.25) << "RMS error " << std::sqrt(err2 / double(m * n)) << " vs Q8_0's "
                                                 << std::sqrt(q8_err2 / double(m * n));
    });
  }
}

TEST(LinearInt8, NanAndInfInputsReachTheOutputs) {
  std::mt19937 rng(204);
  const Layer l = testing::make_nvfp4(rng, 24, 64, true);
  PreparedLinear w = prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                            prepare::GlobalScaleConvention::Divisor, "t");
  w.activation_precision = ActivationPrecision::Int8;
  auto x = random_x_with_outliers(rng, 3, 64);
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

// Int8Decode takes the Int8 path bit for bit where the SIMD int8 kernel makes one pass over the weights (m ≤
// int8_one_pass_rows(): decode steps) and the Fp32 path bit for bit above it (prefill) and where that kernel does
// not exist (one_pass = 0). Fails if the routing ignores m or is inverted: the two paths differ in every case.
TEST(LinearInt8, DecodePrecisionIsInt8UpToTheOnePassRowsAndFp32Above) {
  std::mt19937 rng(211);
  for (bool nvfp4 : {true, false}) {
    SCOPED_TRACE(nvfp4 ? "nvfp4" : "mxfp4");
    const Layer l = nvfp4 ? testing::make_nvfp4(rng, 37, 96, true) : testing::make_mxfp4(rng, 37, 96);
    PreparedLinear w = nvfp4 ? prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                                      prepare::GlobalScaleConvention::Divisor, "t")
                             : prepare::prepare_mxfp4(l.weight.view(), l.scale.view(), "t");
    for_each_int8_target([&] {
      const int64_t one_pass = int8_one_pass_rows();
      for (int64_t m : {int64_t{1}, one_pass, one_pass + 1, int64_t{17}}) {
        if (m < 1) continue;
        SCOPED_TRACE(::testing::Message() << "m " << m << " (one pass up to " << one_pass << ")");
        const auto x = random_x_with_outliers(rng, m, l.k);
        const auto run = [&](ActivationPrecision precision) {
          w.activation_precision = precision;
          std::vector<float> y(static_cast<size_t>(m * l.n), std::numeric_limits<float>::quiet_NaN());
          linear(w, x.data(), m, y.data());
          return y;
        };
        const auto fp32 = run(ActivationPrecision::Fp32);
        const auto int8 = run(ActivationPrecision::Int8);
        const auto decode = run(ActivationPrecision::Int8Decode);
        ASSERT_NE(fp32, int8) << "the two paths must differ for this test to tell them apart";
        EXPECT_EQ(decode, m <= one_pass ? int8 : fp32);
      }
    });
  }
}

// The composite precisions split at the rows the SIMD int8 kernel serves in one pass; a layer with one of them runs
// exactly the int8 / bf16 kernel of its half (equal bits to the layer with that precision).
TEST(ActivationPrecisionRows, CompositesSplitAtTheDecodeRows) {
  const int64_t decode = int8_one_pass_rows();
  for (const int64_t m : {int64_t{1}, int64_t{4}, int64_t{8}, int64_t{9}, int64_t{64}}) {
    const bool small = m <= decode;
    EXPECT_EQ(precision_for_rows(ActivationPrecision::Bf16DecodeInt8, m),
              small || decode == 0 ? ActivationPrecision::Bf16 : ActivationPrecision::Int8) << m;
    EXPECT_EQ(precision_for_rows(ActivationPrecision::Int8Decode, m),
              small ? ActivationPrecision::Int8 : ActivationPrecision::Fp32) << m;
    EXPECT_EQ(precision_for_rows(ActivationPrecision::Bf16, m), ActivationPrecision::Bf16);
  }
  std::mt19937 rng(77);
  const Layer l = testing::make_nvfp4(rng, 40, 256, true);
  const auto layer = [&](ActivationPrecision p) {
    PreparedLinear w = prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                              prepare::GlobalScaleConvention::Divisor, "t");
    w.activation_precision = p;
    return w;
  };
  const PreparedLinear composite = layer(ActivationPrecision::Bf16DecodeInt8);
  for (const int64_t m : {int64_t{3}, int64_t{33}}) {
    std::vector<float> x(static_cast<size_t>(m * 256));
    std::normal_distribution<float> dist(0.f, 1.f);
    for (float& v : x) v = dist(rng);
    std::vector<float> got(static_cast<size_t>(m * 40)), want(got.size());
    linear(composite, x.data(), m, got.data());
    linear(layer(precision_for_rows(ActivationPrecision::Bf16DecodeInt8, m)), x.data(), m, want.data());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "m " << m << " element " << i;
  }
}

// auto's measurement: measured exactly where both fast kernels exist, bf16 decode, int8 batched rows only where
// int8 took ≤ 0.8 of bf16's time over 16 and 64 rows (the geometric mean of the two ratios).
TEST(ActivationPrecisionProbe, ChoosesInt8ForBatchedRowsOnlyWhereClearlyFaster) {
  const PrecisionProbe probe = probe_activation_precision(1536, 576);
  EXPECT_EQ(probe.measured, int8_one_pass_rows() > 0 && bf16_dot_active());
  if (!probe.measured) GTEST_SKIP() << "this CPU lacks the SIMD int8 or the bf16-dot kernel: auto is not measured";
  EXPECT_GT(probe.bf16_step_s, 0.0);
  EXPECT_GT(probe.int8_step_s, 0.0);
  EXPECT_GT(probe.bf16_batched_s, 0.0);
  EXPECT_GT(probe.int8_batched_s, 0.0);
  const double ratio = std::sqrt(probe.int8_step_s / probe.bf16_step_s * probe.int8_batched_s / probe.bf16_batched_s);
  EXPECT_NEAR(probe.int8_ratio(), ratio, 1e-12);
  const bool int8_batched = ratio <= 0.8;
  EXPECT_EQ(precision_for_rows(probe.choice, 1), ActivationPrecision::Bf16);
  EXPECT_EQ(precision_for_rows(probe.choice, 64), int8_batched ? ActivationPrecision::Int8 : ActivationPrecision::Bf16);
  RecordProperty("choice", std::string(prepare::activation_precision_name(probe.choice)));
}

}  // namespace
}  // namespace fp4serve::kernels
