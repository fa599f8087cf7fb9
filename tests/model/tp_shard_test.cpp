// SPDX-License-Identifier: Apache-2.0
// Tensor-parallel shards as the loader prepares them (model::PlannedWeights with a plan::TensorParallelPlan), in
// one process: a one-layer Llama checkpoint of seeded random weights in each format is written to a temporary
// folder, every rank's shard of down_proj / o_proj (row-parallel) runs on its slice of the input, and the sum of
// the partial outputs is compared with x·Wᵀ in float64 from the weights' own dequantization (tests/backends/cpu/prepare's
// checkpoint_tensors.h, written from the format description). Column-parallel gate|up shards are compared row
// by row, so a global scale merged across shards (a max) would show.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "backends/cpu/cpu_linear.h"
#include "backends/registry.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors_writer.h"
#include "fp4serve/error.h"
#include "model/planned_weights.h"
#include "plan/shard.h"
#include "tp_checkpoint.h"

namespace fp4serve::model {
namespace {

namespace fs = std::filesystem;
using fp4serve::testing::Layer;
using nlohmann::json;
using tp_testing::Format;
using tp_testing::write_llama;

constexpr int64_t kHidden = tp_testing::kHidden;

std::vector<float> random_input(int64_t m, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(0.1f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = (rng() & 1) ? d(rng) : -d(rng);
  return x;
}

// max |y − x·Wᵀ| / max over outputs of Σ|x||w| (the scale float32 accumulation errs on).
double relative_error(const std::vector<float>& y, const std::vector<float>& x, const Layer& l, int64_t m,
                      int64_t row0 = 0, int64_t rows = -1) {
  if (rows < 0) rows = l.n;
  double err = 0, scale = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double ref = 0, mag = 0;
      for (int64_t c = 0; c < l.k; ++c) {
        const double w = l.w[static_cast<size_t>((row0 + r) * l.k + c)];
        ref += x[static_cast<size_t>(i * l.k + c)] * w;
        mag += std::fabs(x[static_cast<size_t>(i * l.k + c)] * w);
      }
      err = std::max(err, std::fabs(y[static_cast<size_t>(i * rows + r)] - ref));
      scale = std::max(scale, mag);
    }
  }
  return err / scale;
}

struct ShardCase {
  Format format;
  int64_t inter;
  int ranks;
  std::string tag;
  double tol;  // dense bf16 and FP4 weights are exact; the error is the fp32 accumulation only
};

class RowParallel : public ::testing::TestWithParam<ShardCase> {};

TEST_P(RowParallel, ShardSumEqualsTheFullGemmAndColumnShardsKeepTheirScales) {
  const ShardCase& c = GetParam();
  const auto ck = write_llama(c.format, c.inter, c.tag, c.ranks);
  const auto ckpt = checkpoint::Checkpoint::open(ck->dir);
  const auto catalogue = backends::catalogue_for(plan::resolve_device(plan::DeviceChoice::Cpu));
  const plan::LayerPlan lp = plan::build_plan(ckpt, {catalogue.get(), plan::ActivationQuant::Auto});
  ASSERT_TRUE(lp.complete());
  const plan::TensorParallelPlan tp = plan::plan_tensor_parallel(lp, c.ranks, false);
  LoadProgress progress(0, 0, {});
  constexpr int64_t m = 3;
  for (const char* name : {"model.layers.0.mlp.down_proj", "model.layers.0.self_attn.o_proj"}) {
    const Layer& l = ck->layers.at(name);
    const std::vector<float> x = random_input(m, l.k, 7);
    std::vector<float> sum(static_cast<size_t>(m * l.n), 0.f);
    int64_t covered = 0;
    for (int r = 0; r < c.ranks; ++r) {
      const PlannedWeights w(ckpt, lp, progress, &tp, r);
      LinearGroup g = w.linear_group({name});
      const plan::ModuleShard s = plan::module_shard(tp, *lp.find(name), r);
      ASSERT_EQ(g.in_features(), s.columns.size()) << name << " rank " << r;
      ASSERT_EQ(g.out_features(), l.n);
      std::vector<float> xs(static_cast<size_t>(m * s.columns.size()));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < s.columns.size(); ++j) {
          xs[static_cast<size_t>(i * s.columns.size() + j)] = x[static_cast<size_t>(i * l.k + s.columns.begin + j)];
        }
      }
      std::vector<float> y(static_cast<size_t>(m * l.n)), scratch;
      backends::cpu::linear_forward(backends::cpu::prepare_linear_group(std::move(g)), xs.data(), m, y.data(), scratch);
      for (size_t i = 0; i < y.size(); ++i) sum[i] += y[i];
      covered += s.columns.size();
    }
    EXPECT_EQ(covered, l.k);
    EXPECT_LT(relative_error(sum, x, l, m), c.tol) << name;
  }
  // gate|up (fused when the plan fuses them): each rank's rows are its gate rows then its up rows.
  const Layer& gate = ck->layers.at("model.layers.0.mlp.gate_proj");
  const Layer& up = ck->layers.at("model.layers.0.mlp.up_proj");
  const std::vector<float> x = random_input(m, kHidden, 11);
  for (int r = 0; r < c.ranks; ++r) {
    const PlannedWeights w(ckpt, lp, progress, &tp, r);
    LinearGroup g = w.linear_group({"model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"});
    const int64_t g_out = g.out_features();
    const plan::IndexRange rows = tp.layers[0].ffn_columns[static_cast<size_t>(r)];
    ASSERT_EQ(g_out, 2 * rows.size());
    std::vector<float> y(static_cast<size_t>(m * g_out)), scratch;
    backends::cpu::linear_forward(backends::cpu::prepare_linear_group(std::move(g)), x.data(), m, y.data(), scratch);
    std::vector<float> yg, yu;
    for (int64_t i = 0; i < m; ++i) {
      const auto* row = y.data() + i * g_out;
      yg.insert(yg.end(), row, row + rows.size());
      yu.insert(yu.end(), row + rows.size(), row + 2 * rows.size());
    }
    EXPECT_LT(relative_error(yg, x, gate, m, rows.begin, rows.size()), c.tol) << "gate rank " << r;
    EXPECT_LT(relative_error(yu, x, up, m, rows.begin, rows.size()), c.tol) << "up rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, RowParallel,
    ::testing::Values(ShardCase{Format::Nvfp4, 80, 3, "nvfp4", 1e-5},        // 80 = 32/32/16, uneven
                      ShardCase{Format::Mxfp4, 352, 3, "mxfp4", 1e-5},       // 352 = 128/128/96 (llama-i352)
                      ShardCase{Format::Int4, 96, 3, "int4", 1e-5},
                      ShardCase{Format::Int4Actorder, 128, 2, "int4_gidx", 1e-5},
                      ShardCase{Format::Fp8Block, 96, 2, "fp8", 1e-5},
                      ShardCase{Format::Dense, 88, 2, "dense", 1e-5}),      // 88 = 48/40 on 8-column octets
    [](const auto& param_info) { return param_info.param.tag; });

TEST(RowParallel, AGlobalActivationOrderThatARankCannotHoldIsRefusedNamingTheGroup) {
  const auto ck = write_llama(Format::Int4ActorderGlobal, 128, "int4_gidx_global", 2);
  const auto ckpt = checkpoint::Checkpoint::open(ck->dir);
  const auto catalogue = backends::catalogue_for(plan::resolve_device(plan::DeviceChoice::Cpu));
  const plan::LayerPlan lp = plan::build_plan(ckpt, {catalogue.get(), plan::ActivationQuant::Auto});
  const plan::TensorParallelPlan tp = plan::plan_tensor_parallel(lp, 2, false);
  LoadProgress progress(0, 0, {});
  const PlannedWeights w(ckpt, lp, progress, &tp, 1);
  try {
    (void)w.linear_group({"model.layers.0.mlp.down_proj"});
    FAIL() << "a shuffled g_idx was split";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.down_proj"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot be split over tensor_parallel_size 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp4serve::model
