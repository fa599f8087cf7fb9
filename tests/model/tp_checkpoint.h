// SPDX-License-Identifier: Apache-2.0
// A one-layer Llama checkpoint of seeded random weights in one format (NVFP4, MXFP4, int4 with or without an
// activation order, FP8 block, bf16), written to a temporary folder with the float64 weights kept for reference
// math; 6 q / 3 KV heads for 3 ranks, 4 / 2 otherwise. Shared by tp_shard_test and tp_parity_mpi_test.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>

#include "../plan/synthetic.h"
#include "../quant/checkpoint_tensors.h"
#include "checkpoint/safetensors_writer.h"

namespace fp4serve::model::tp_testing {

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

inline checkpoint::TensorRecord record(const std::string& name, const fp4serve::testing::OwnedTensor& t) {
  return {name, t.dtype, t.shape, t.data};
}

// int4 with an activation order whose groups each lie inside one rank's columns (shuffled within `block`
// columns), or a global shuffle (as GPTQ writes it) when block = k.
inline Layer make_int4_blocked_actorder(std::mt19937& rng, int64_t n, int64_t k, int64_t block) {
  Layer l = fp4serve::testing::make_int4(rng, n, k, 32, true, false);
  std::vector<int32_t> gidx(static_cast<size_t>(k));
  for (int64_t c = 0; c < k; ++c) gidx[static_cast<size_t>(c)] = static_cast<int32_t>(c / 32);
  // Modules that read one input (q/k/v, gate/up) share its activation order, as GPTQ's Hessian is the input's.
  std::mt19937 order(static_cast<unsigned>(k * 31 + block));
  for (int64_t b = 0; b < k; b += block) std::shuffle(gidx.begin() + b, gidx.begin() + std::min(k, b + block), order);
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
inline std::unique_ptr<Checkpoint> write_llama(Format format, int64_t inter, const std::string& tag, int ranks) {
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
        {
          // Row-parallel modules (o_proj, down_proj) shuffle within each rank's columns; the others anywhere.
          const bool row_parallel = short_name == "self_attn.o_proj" || short_name == "mlp.down_proj";
          l = make_int4_blocked_actorder(rng, n, k, format == Format::Int4Actorder && row_parallel ? k / ranks : k);
        }
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

}  // namespace fp4serve::model::tp_testing
