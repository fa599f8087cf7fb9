// SPDX-License-Identifier: Apache-2.0
// Tensor-parallel shards as the loader prepares them (model::PlannedWeights with a plan::TensorParallelPlan), in
// one process: a one-layer Llama checkpoint of seeded random weights in each format is written to a temporary
// folder, every rank's shard of down_proj / o_proj (row-parallel) runs on its slice of the input, and the sum of
// the partial outputs is compared with x·Wᵀ in float64 from the weights' own dequantization (tests/prepare's
// checkpoint_tensors.h, written from the format description). Column-parallel gate|up shards are compared row
// by row, so a global scale merged across shards (a max) would show.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "../plan/synthetic.h"
#include "../prepare/checkpoint_tensors.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors_writer.h"
#include "fp4serve/error.h"
#include "model/planned_weights.h"
#include "plan/shard.h"

namespace fp4serve::model {
namespace {

namespace fs = std::filesystem;
using fp4serve::testing::Layer;
using nlohmann::json;

enum class Format { Nvfp4, Mxfp4, Int4, Int4Actorder, Int4ActorderGlobal, Fp8Block, Dense };

constexpr int64_t kHidden = 64, kHeadDim = 16, kVocab = 32;

struct Checkpoint {
  fs::path dir;
  std::map<std::string, Layer> layers;  // by module name
  ~Checkpoint() { fs::remove_all(dir); }
};

checkpoint::TensorRecord record(const std::string& name, const fp4serve::testing::OwnedTensor& t) {
  return {name, t.dtype, t.shape, t.data};
}

// int4 with an activation order whose groups each lie inside one rank's columns (shuffled within `block`
// columns), or a global shuffle (as GPTQ writes it) when block = k.
Layer make_int4_blocked_actorder(std::mt19937& rng, int64_t n, int64_t k, int64_t block) {
  Layer l = fp4serve::testing::make_int4(rng, n, k, 32, true, false);
  std::vector<int32_t> gidx(static_cast<size_t>(k));
  for (int64_t c = 0; c < k; ++c) gidx[static_cast<size_t>(c)] = static_cast<int32_t>(c / 32);
  for (int64_t b = 0; b < k; b += block) std::shuffle(gidx.begin() + b, gidx.begin() + std::min(k, b + block), rng);
  // Re-derive W with the new group of each column (codes and scales unchanged).
  const int64_t groups = k / 32;
  const auto* scales = reinterpret_cast<const uint16_t*>(l.scale.data.data());
  const auto* zw = reinterpret_cast<const int32_t*>(l.zero_point.data.data());
  const auto* words = reinterpret_cast<const int32_t*>(l.weight.data.data());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const int64_t g = gidx[static_cast<size_t>(c)];
      const int q = static_cast<int>((static_cast<uint32_t>(words[r * (k / 8) + c / 8]) >> (4 * (c % 8))) & 0xF) - 8;
      const int z = static_cast<int>((static_cast<uint32_t>(zw[(r / 8) * groups + g]) >> (4 * (r % 8))) & 0xF) - 8;
      l.w[static_cast<size_t>(r * k + c)] = (q - z) * static_cast<double>(fp4serve::testing::bf16_value(scales[r * groups + g]));
    }
  }
  l.has_g_idx = true;
  l.g_idx = fp4serve::testing::OwnedTensor::from(core::DType::I32, {k}, gidx);
  return l;
}

// Heads per rank count: 6 q / 3 KV heads for 3 ranks, 4 / 2 otherwise.
std::unique_ptr<Checkpoint> write_llama(Format format, int64_t inter, const std::string& tag, int ranks) {
  const int64_t kHeads = ranks == 3 ? 6 : 4, kKvHeads = kHeads / 2;
  auto ck = std::make_unique<Checkpoint>();
  ck->dir = fs::temp_directory_path() / ("fp4serve_tp_shard_" + tag);
  fs::remove_all(ck->dir);
  fs::create_directories(ck->dir);
  std::mt19937 rng(1234 + static_cast<unsigned>(format));
  std::vector<checkpoint::TensorRecord> records;
  const auto dense_record = [&](const std::string& name, std::vector<int64_t> shape) {
    std::vector<uint16_t> bits(static_cast<size_t>(shape[0] * (shape.size() > 1 ? shape[1] : 1)));
    std::normal_distribution<float> d(shape.size() == 1 ? 1.f : 0.f, 0.1f);
    for (auto& b : bits) b = fp4serve::testing::bf16_rne(d(rng));
    records.push_back(record(name, fp4serve::testing::OwnedTensor::from(core::DType::BF16, shape, bits)));
  };
  dense_record("model.embed_tokens.weight", {kVocab, kHidden});
  dense_record("lm_head.weight", {kVocab, kHidden});
  dense_record("model.norm.weight", {kHidden});
  dense_record("model.layers.0.input_layernorm.weight", {kHidden});
  dense_record("model.layers.0.post_attention_layernorm.weight", {kHidden});
  const std::vector<std::tuple<std::string, int64_t, int64_t>> mods = {
      {"self_attn.q_proj", kHeads * kHeadDim, kHidden}, {"self_attn.k_proj", kKvHeads * kHeadDim, kHidden},
      {"self_attn.v_proj", kKvHeads * kHeadDim, kHidden}, {"self_attn.o_proj", kHidden, kHeads * kHeadDim},
      {"mlp.gate_proj", inter, kHidden}, {"mlp.up_proj", inter, kHidden}, {"mlp.down_proj", kHidden, inter}};
  for (const auto& [short_name, n, k] : mods) {
    const std::string p = "model.layers.0." + short_name;
    Layer l;
    switch (format) {
      case Format::Nvfp4: l = fp4serve::testing::make_nvfp4(rng, n, k, true); break;
      case Format::Mxfp4: l = fp4serve::testing::make_mxfp4(rng, n, k); break;
      case Format::Int4: l = fp4serve::testing::make_int4(rng, n, k, 32, true, false); break;
      case Format::Int4Actorder:
      case Format::Int4ActorderGlobal:
        l = make_int4_blocked_actorder(rng, n, k, format == Format::Int4Actorder ? k / ranks : k);
        break;
      case Format::Fp8Block: l = fp4serve::testing::make_fp8(rng, n, k, 2, 16, 16); break;
      case Format::Dense: l = fp4serve::testing::make_dense(rng, n, k, core::DType::BF16); break;
    }
    switch (format) {
      case Format::Nvfp4:
        records.push_back(record(p + ".weight_packed", l.weight));
        records.push_back(record(p + ".weight_scale", l.scale));
        records.push_back(record(p + ".weight_global_scale",
                                 fp4serve::testing::OwnedTensor::from(core::DType::F32, {1}, std::vector<float>{l.global_scale})));
        break;
      case Format::Mxfp4:
        records.push_back(record(p + ".weight_packed", l.weight));
        records.push_back(record(p + ".weight_scale", l.scale));
        break;
      case Format::Int4:
      case Format::Int4Actorder:
      case Format::Int4ActorderGlobal:
        records.push_back(record(p + ".weight_packed", l.weight));
        records.push_back(record(p + ".weight_scale", l.scale));
        records.push_back(record(p + ".weight_zero_point", l.zero_point));
        records.push_back(record(p + ".weight_shape", fp4serve::testing::OwnedTensor::from(
                                                          core::DType::I64, {2}, std::vector<int64_t>{n, k})));
        if (l.has_g_idx) records.push_back(record(p + ".weight_g_idx", l.g_idx));
        break;
      case Format::Fp8Block:
      case Format::Dense:
        records.push_back(record(p + ".weight", l.weight));
        if (format == Format::Fp8Block) records.push_back(record(p + ".weight_scale", l.scale));
        break;
    }
    ck->layers.emplace(p, std::move(l));
  }
  checkpoint::write_safetensors(ck->dir / "model.safetensors", records);
  json config = {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", kHidden}, {"intermediate_size", inter},
                 {"num_hidden_layers", 1}, {"num_attention_heads", kHeads}, {"num_key_value_heads", kKvHeads},
                 {"head_dim", kHeadDim}, {"vocab_size", kVocab}, {"tie_word_embeddings", false},
                 {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0}, {"max_position_embeddings", 64}};
  using plan::testing::ct_args;
  using plan::testing::ct_quant;
  switch (format) {
    case Format::Nvfp4: config["quantization_config"] = ct_quant("nvfp4-pack-quantized", plan::testing::nvfp4_w(), nullptr); break;
    case Format::Mxfp4: config["quantization_config"] = ct_quant("mxfp4-pack-quantized", plan::testing::mxfp4_w(), nullptr); break;
    case Format::Int4:
    case Format::Int4Actorder:
    case Format::Int4ActorderGlobal:
      config["quantization_config"] = ct_quant("pack-quantized",
                                               ct_args(4, "int", "group", 32, false, "torch.bfloat16", false,
                                                       format == Format::Int4 ? json(nullptr) : json("group")),
                                               nullptr);
      break;
    case Format::Fp8Block: {
      json w = ct_args(8, "float", "block", nullptr, false, "torch.bfloat16");
      w["block_structure"] = {16, 16};
      config["quantization_config"] = ct_quant("float-quantized", w, nullptr);
      break;
    }
    case Format::Dense: break;
  }
  std::ofstream(ck->dir / "config.json") << config.dump(2);
  return ck;
}

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

struct Case {
  Format format;
  int64_t inter;
  int ranks;
  std::string tag;
  double tol;  // dense bf16 and FP4 weights are exact; the error is the fp32 accumulation only
};

class RowParallel : public ::testing::TestWithParam<Case> {};

TEST_P(RowParallel, ShardSumEqualsTheFullGemmAndColumnShardsKeepTheirScales) {
  const Case& c = GetParam();
  const auto ck = write_llama(c.format, c.inter, c.tag, c.ranks);
  const auto ckpt = checkpoint::Checkpoint::open(ck->dir);
  const plan::LayerPlan lp = plan::build_plan(ckpt, {plan::resolve_device("cpu"), plan::ActivationQuant::Auto});
  ASSERT_TRUE(lp.complete());
  const plan::TensorParallelPlan tp = plan::plan_tensor_parallel(lp, c.ranks, false);
  LoadProgress progress(0, 0, false);
  constexpr int64_t m = 3;
  for (const char* name : {"model.layers.0.mlp.down_proj", "model.layers.0.self_attn.o_proj"}) {
    const Layer& l = ck->layers.at(name);
    const std::vector<float> x = random_input(m, l.k, 7);
    std::vector<float> sum(static_cast<size_t>(m * l.n), 0.f);
    int64_t covered = 0;
    for (int r = 0; r < c.ranks; ++r) {
      const PlannedWeights w(ckpt, lp, progress, &tp, r);
      const LinearGroup g = w.linear_group({name});
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
      g.forward(xs.data(), m, y.data(), scratch);
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
    const LinearGroup g = w.linear_group({"model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"});
    const plan::IndexRange rows = tp.layers[0].ffn_columns[static_cast<size_t>(r)];
    ASSERT_EQ(g.out_features(), 2 * rows.size());
    std::vector<float> y(static_cast<size_t>(m * g.out_features())), scratch;
    g.forward(x.data(), m, y.data(), scratch);
    std::vector<float> yg, yu;
    for (int64_t i = 0; i < m; ++i) {
      const auto* row = y.data() + i * g.out_features();
      yg.insert(yg.end(), row, row + rows.size());
      yu.insert(yu.end(), row + rows.size(), row + 2 * rows.size());
    }
    EXPECT_LT(relative_error(yg, x, gate, m, rows.begin, rows.size()), c.tol) << "gate rank " << r;
    EXPECT_LT(relative_error(yu, x, up, m, rows.begin, rows.size()), c.tol) << "up rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, RowParallel,
    ::testing::Values(Case{Format::Nvfp4, 80, 3, "nvfp4", 1e-5},        // 80 = 32/32/16, uneven
                      Case{Format::Mxfp4, 352, 3, "mxfp4", 1e-5},       // 352 = 128/128/96 (llama-i352)
                      Case{Format::Int4, 96, 3, "int4", 1e-5},
                      Case{Format::Int4Actorder, 128, 2, "int4_gidx", 1e-5},
                      Case{Format::Fp8Block, 96, 2, "fp8", 1e-5},
                      Case{Format::Dense, 88, 2, "dense", 1e-5}),      // 88 = 48/40 on 8-column octets
    [](const auto& info) { return info.param.tag; });

TEST(RowParallel, AGlobalActivationOrderThatARankCannotHoldIsRefusedNamingTheGroup) {
  const auto ck = write_llama(Format::Int4ActorderGlobal, 128, "int4_gidx_global", 2);
  const auto ckpt = checkpoint::Checkpoint::open(ck->dir);
  const plan::LayerPlan lp = plan::build_plan(ckpt, {plan::resolve_device("cpu"), plan::ActivationQuant::Auto});
  const plan::TensorParallelPlan tp = plan::plan_tensor_parallel(lp, 2, false);
  LoadProgress progress(0, 0, false);
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
