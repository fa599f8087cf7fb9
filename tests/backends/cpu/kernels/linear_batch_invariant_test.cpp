// SPDX-License-Identifier: Apache-2.0
// Batch-invariant mode (backends/cpu/kernels/batch_invariant.h): row r of an M-row linear() is bit for bit the row
// computed alone (M = 1, one thread), for every layout and activation precision, for M across the GEMV / streaming /
// panel boundaries of every SIMD target, with 1 to 3 threads; and the default mode provably is not (the same
// comparison finds a differing row there), so these tests can fail.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels/batch_invariant.h"
#include "backends/cpu/kernels/linear.h"
#include "backends/cpu/kernels/linear_check.h"
#include "core/threading.h"
#include "quant/checkpoint_tensors.h"
#include "backends/cpu/prepare/repack.h"

namespace fp4serve::kernels::linear_invariant {
namespace {

using prepare::ActivationPrecision;
using prepare::GlobalScaleConvention;
using prepare::PreparedLinear;
using testing::Layer;

// Across kMaxM of the GEMVs (4, 8), kMR of the panel (6, 12), the bf16-pair chunk (4) and the panel's m > kMR path.
constexpr int64_t kMs[] = {2, 3, 4, 5, 7, 8, 9, 12, 13, 17, 37};
constexpr int64_t kMaxRows = 37;

class ThreadsScope {
 public:
  explicit ThreadsScope(int n) : was_(core::num_threads()) { core::set_num_threads(n); }
  ~ThreadsScope() { core::set_num_threads(was_); }
  ThreadsScope(const ThreadsScope&) = delete;
  ThreadsScope& operator=(const ThreadsScope&) = delete;

 private:
  int was_;
};

using testing_util::for_each_target;

std::vector<float> random_x(std::mt19937& rng, int64_t m, int64_t k) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (auto& v : x) v = dist(rng);
  return x;
}

// Rows of an M-row call that differ in any bit from the same rows computed one at a time on one thread, summed over
// kMs and 1–3 threads, on the current target and mode.
int64_t rows_differing_from_alone(const PreparedLinear& w, const std::vector<float>& x) {
  const int64_t k = w.in_features, n = w.out_features;
  std::vector<float> alone(static_cast<size_t>(kMaxRows * n));
  {
    ThreadsScope one(1);
    for (int64_t r = 0; r < kMaxRows; ++r) linear(w, x.data() + r * k, 1, alone.data() + r * n);
  }
  int64_t differing = 0;
  for (int threads : {1, 2, 3}) {
    ThreadsScope scope(threads);
    for (int64_t m : kMs) {
      // Rows 0 … m − 1 and, so that a row also moves within the batch, rows kMaxRows − m … kMaxRows − 1.
      for (int64_t first : {int64_t{0}, kMaxRows - m}) {
        std::vector<float> y(static_cast<size_t>(m * n));
        linear(w, x.data() + first * k, m, y.data());
        for (int64_t r = 0; r < m; ++r) {
          differing += std::memcmp(y.data() + r * n, alone.data() + (first + r) * n, sizeof(float) * n) != 0;
        }
      }
    }
  }
  return differing;
}

struct Named {
  std::string name;
  PreparedLinear w;
};

// One layer of every layout, and the FP4 ones at every activation precision. N 72 (a lone last tile of a pair, a
// partial 32-column panel), K 544 (past one 256-column panel chunk).
std::vector<Named> layers(std::mt19937& rng) {
  const int64_t n = 72, k = 544;
  std::vector<Named> out;
  const Layer nv = testing::make_nvfp4(rng, n, k, true);
  const Layer mx = testing::make_mxfp4(rng, n, k);
  for (ActivationPrecision p : {ActivationPrecision::Fp32, ActivationPrecision::Bf16, ActivationPrecision::Int8,
                                ActivationPrecision::Int8Decode}) {
    PreparedLinear a = prepare::prepare_nvfp4(nv.weight.view(), nv.scale.view(), nv.global_scale,
                                              GlobalScaleConvention::Divisor, "nvfp4");
    a.activation_precision = p;
    out.push_back({"nvfp4 " + std::string(prepare::activation_precision_name(p)), std::move(a)});
    PreparedLinear b = prepare::prepare_mxfp4(mx.weight.view(), mx.scale.view(), "mxfp4");
    b.activation_precision = p;
    out.push_back({"mxfp4 " + std::string(prepare::activation_precision_name(p)), std::move(b)});
  }
  const Layer i4 = testing::make_int4(rng, n, k, 32, true, false);
  const core::TensorView zero_point = i4.zero_point.view();
  out.push_back({"int4", prepare::prepare_int4(i4.weight.view(), i4.scale.view(), &zero_point, nullptr, k, 32, "int4")});
  const Layer f8 = testing::make_fp8(rng, n, k, 1);
  out.push_back({"fp8 channel", prepare::prepare_fp8(f8.weight.view(), f8.scale.view(), {}, "fp8")});
  const Layer f8b = testing::make_fp8(rng, n, k, 2, 128, 128);
  out.push_back({"fp8 block", prepare::prepare_fp8(f8b.weight.view(), f8b.scale.view(), {128, 128}, "fp8b")});
  const Layer bf = testing::make_dense(rng, n, k, core::DType::BF16);
  out.push_back({"dense bf16", prepare::prepare_dense(bf.weight.view(), "bf16")});
  // A bf16 lm_head under the bf16 precisions: outside the mode m > 4 takes bf16 dot products on rounded x.
  for (ActivationPrecision p : {ActivationPrecision::Bf16, ActivationPrecision::Bf16DecodeInt8}) {
    PreparedLinear d = prepare::prepare_dense(bf.weight.view(), "bf16");
    d.activation_precision = p;
    out.push_back({"dense bf16 " + std::string(prepare::activation_precision_name(p)), std::move(d)});
  }
  out.push_back({"lm_head fp8 rows", prepare::prepare_dense_as_fp8_rows(bf.weight.view(), "fp8rows")});
  out.push_back({"lm_head int8 rows", prepare::prepare_dense_as_int8_rows(bf.weight.view(), "int8rows")});
  const Layer f32 = testing::make_dense(rng, n, k, core::DType::F32);
  out.push_back({"dense f32", prepare::prepare_dense(f32.weight.view(), "f32")});
  return out;
}

TEST(LinearBatchInvariant, EveryRowEqualsTheRowAloneForAnyBatchAndThreads) {
  std::mt19937 rng(4301);
  const std::vector<Named> all = layers(rng);
  const auto x = random_x(rng, kMaxRows, 544);
  const BatchInvariantScope on(true);
  for_each_target([&] {
    for (const Named& l : all) {
      SCOPED_TRACE(l.name);
      EXPECT_EQ(rows_differing_from_alone(l.w, x), 0);
    }
  });
}

// The comparison above has teeth: without the mode, the GEMV (M = 1) and the panel GEMM (M > 4 / 8) sum a row in
// different orders, and some row differs in its last bits.
TEST(LinearBatchInvariant, DefaultModeDiffersSoTheCheckCanFail) {
  if (gemv_max_rows() == 0) GTEST_SKIP() << "the fallback target runs one kernel for every m";
  std::mt19937 rng(4302);
  const Layer nv = testing::make_nvfp4(rng, 72, 544, true);
  const PreparedLinear w = prepare::prepare_nvfp4(nv.weight.view(), nv.scale.view(), nv.global_scale,
                                                  GlobalScaleConvention::Divisor, "nvfp4");
  const auto x = random_x(rng, kMaxRows, 544);
  const BatchInvariantScope off(false);
  EXPECT_GT(rows_differing_from_alone(w, x), 0);
}

// The same for a bf16 lm_head at ActivationPrecision::Bf16: without the mode, M > 4 rounds x to bf16 for the dot
// products while M = 1 keeps fp32 x, so rows differ; the mode keeps fp32 x for every M (checked above).
TEST(LinearBatchInvariant, DefaultModeDiffersForABf16LmHead) {
  if (!bf16_dot_active()) GTEST_SKIP() << "no AVX512-BF16 dot products: fp32 x for every m";
  std::mt19937 rng(4304);
  const Layer bf = testing::make_dense(rng, 72, 544, core::DType::BF16);
  PreparedLinear w = prepare::prepare_dense(bf.weight.view(), "bf16");
  w.activation_precision = ActivationPrecision::Bf16;
  const auto x = random_x(rng, kMaxRows, 544);
  const BatchInvariantScope off(false);
  EXPECT_GT(rows_differing_from_alone(w, x), 0);
}

// Batch-invariant results stay correct: the same float64 bound as linear_test's (K + 4)·2^−24·Σ|x·w| plus the
// bf16-pair term 2^−17 (x carried as two bf16) for a 37-row NVFP4 call.
TEST(LinearBatchInvariant, ResultsStayWithinTheFloat64Bound) {
  std::mt19937 rng(4303);
  const int64_t n = 72, k = 544, m = kMaxRows;
  const Layer l = testing::make_nvfp4(rng, n, k, false);
  const PreparedLinear w = prepare::prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale,
                                                  GlobalScaleConvention::Multiplier, "nvfp4");
  const auto x = random_x(rng, m, k);
  const BatchInvariantScope on(true);
  for_each_target([&] {
    std::vector<float> y(static_cast<size_t>(m * n), std::numeric_limits<float>::quiet_NaN());
    linear(w, x.data(), m, y.data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0, mag = 0;
        for (int64_t c = 0; c < k; ++c) {
          const double p = double(x[static_cast<size_t>(i * k + c)]) * l.w[static_cast<size_t>(j * k + c)];
          ref += p;
          mag += std::fabs(p);
        }
        const double extra = bf16_dot_active() ? 0x1p-17 : 0.0;
        ASSERT_LE(std::fabs(y[static_cast<size_t>(i * n + j)] - ref), ((k + 4) * 0x1p-24 + extra) * mag)
            << "y[" << i << ", " << j << "]";
      }
    }
  });
}

}  // namespace
}  // namespace fp4serve::kernels::linear_invariant
