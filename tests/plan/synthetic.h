// SPDX-License-Identifier: Apache-2.0
// Test-side synthetic checkpoints: config.json objects and safetensors headers written from docs/FORMATS.md
// (§2 compressed-tensors, §3 ModelOpt, §5 GPT-OSS) independently of src/plan's contracts, so that plan tests
// check the code against the format documents rather than against itself.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "plan/layer_plan.h"

namespace fp4serve::plan::testing {

using nlohmann::json;

inline constexpr int64_t kH = 64, kI = 96, kV = 128, kLayers = 2, kHeads = 4, kKv = 2, kHd = 16, kE = 4, kMoeI = 32;

/// How a test writes one Linear's tensors.
enum class Kind {
  Dense, Skip, CtNvfp4A4, CtNvfp4A16, CtMxfp4, CtInt4G32, CtInt4AsymActorder, CtFp8Static, CtFp8Channel,
  MoNvfp4A4, MoNvfp4A16, MoFp8,
};

inline void put(TensorHeaders& h, const std::string& name, core::DType dt, std::vector<int64_t> shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  h[name] = TensorHeader{dt, std::move(shape), static_cast<uint64_t>(numel) * core::dtype_bits(dt) / 8};
}

inline void write_module(TensorHeaders& h, const std::string& p, int64_t n, int64_t k, Kind kind) {
  using core::DType;
  switch (kind) {
    case Kind::Skip: return;
    case Kind::Dense: put(h, p + ".weight", DType::BF16, {n, k}); return;
    case Kind::CtNvfp4A4:
    case Kind::CtNvfp4A16:
      put(h, p + ".weight_packed", DType::U8, {n, k / 2});
      put(h, p + ".weight_scale", DType::F8_E4M3, {n, k / 16});
      put(h, p + ".weight_global_scale", DType::F32, {1});
      if (kind == Kind::CtNvfp4A4) put(h, p + ".input_global_scale", DType::F32, {1});
      return;
    case Kind::CtMxfp4:
      put(h, p + ".weight_packed", DType::U8, {n, k / 2});
      put(h, p + ".weight_scale", DType::U8, {n, k / 32});
      return;
    case Kind::CtInt4G32:
    case Kind::CtInt4AsymActorder:
      put(h, p + ".weight_packed", DType::I32, {n, (k + 7) / 8});
      put(h, p + ".weight_scale", DType::BF16, {n, k / 32});
      put(h, p + ".weight_shape", DType::I64, {2});
      if (kind == Kind::CtInt4AsymActorder) {
        put(h, p + ".weight_zero_point", DType::I32, {(n + 7) / 8, k / 32});
        put(h, p + ".weight_g_idx", DType::I32, {k});
      }
      return;
    case Kind::CtFp8Static:
      put(h, p + ".weight", DType::F8_E4M3, {n, k});
      put(h, p + ".weight_scale", DType::BF16, {1});
      put(h, p + ".input_scale", DType::BF16, {1});
      return;
    case Kind::CtFp8Channel:
      put(h, p + ".weight", DType::F8_E4M3, {n, k});
      put(h, p + ".weight_scale", DType::BF16, {n, 1});
      return;
    case Kind::MoNvfp4A4:
    case Kind::MoNvfp4A16:
      put(h, p + ".weight", DType::U8, {n, k / 2});
      put(h, p + ".weight_scale", DType::F8_E4M3, {n, k / 16});
      put(h, p + ".weight_scale_2", DType::F32, {});
      if (kind == Kind::MoNvfp4A4) put(h, p + ".input_scale", DType::F32, {});
      return;
    case Kind::MoFp8:
      put(h, p + ".weight", DType::F8_E4M3, {n, k});
      put(h, p + ".weight_scale", DType::F32, {});
      put(h, p + ".input_scale", DType::F32, {});
      return;
  }
}

inline json ct_args(int bits, const char* type, const char* strategy, json group, json dynamic = false,
                    json scale_dtype = nullptr, bool symmetric = true, json actorder = nullptr) {
  return {{"num_bits", bits}, {"type", type}, {"symmetric", symmetric}, {"group_size", group}, {"strategy", strategy},
          {"dynamic", dynamic}, {"actorder", actorder}, {"scale_dtype", scale_dtype}, {"zp_dtype", nullptr},
          {"block_structure", nullptr}, {"observer", "minmax"}};
}
inline json nvfp4_w() { return ct_args(4, "float", "tensor_group", 16, false, "torch.float8_e4m3fn"); }
inline json nvfp4_a() { return ct_args(4, "float", "tensor_group", 16, "local", "torch.float8_e4m3fn"); }
inline json mxfp4_w() { return ct_args(4, "float", "group", 32, false, "torch.uint8"); }
inline json mxfp4_a() { return ct_args(4, "float", "group", 32, true, "torch.uint8"); }

/// A compressed-tensors quantization_config with one group targeting "Linear".
inline json ct_quant(const std::string& format, json weights, json input, json ignore = json::array({"lm_head"})) {
  return {{"quant_method", "compressed-tensors"}, {"format", format}, {"version", "0.12.2"},
          {"quantization_status", "compressed"}, {"ignore", ignore}, {"kv_cache_scheme", nullptr},
          {"sparsity_config", json::object()}, {"transform_config", json::object()},
          {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"format", format}, {"weights", weights},
                                          {"input_activations", input}, {"output_activations", nullptr}}}}}};
}

inline json model_config(const std::string& arch, json extra = json::object()) {
  json c = {{"architectures", {arch}}, {"hidden_size", kH}, {"intermediate_size", kI}, {"num_hidden_layers", kLayers},
            {"num_attention_heads", kHeads}, {"num_key_value_heads", kKv}, {"head_dim", kHd}, {"vocab_size", kV},
            {"tie_word_embeddings", false}};
  for (auto& [k, v] : extra.items()) c[k] = v;
  return c;
}

inline json moe_config(json extra = json::object()) {
  json e = {{"num_experts", kE}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", kMoeI}};
  for (auto& [k, v] : extra.items()) e[k] = v;
  return model_config("Qwen3MoeForCausalLM", e);
}

using KindOf = std::function<Kind(const std::string& module)>;

/// Headers of a Llama (or Qwen3 when `qk_norm`) model: norms, embedding, 2 layers of q/k/v/o + gate/up/down, lm_head.
inline TensorHeaders dense_headers(const KindOf& kind_of, bool qk_norm = false, bool tied = false) {
  TensorHeaders h;
  put(h, "model.embed_tokens.weight", core::DType::BF16, {kV, kH});
  put(h, "model.norm.weight", core::DType::BF16, {kH});
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    put(h, p + ".input_layernorm.weight", core::DType::BF16, {kH});
    put(h, p + ".post_attention_layernorm.weight", core::DType::BF16, {kH});
    if (qk_norm) {
      put(h, p + ".self_attn.q_norm.weight", core::DType::BF16, {kHd});
      put(h, p + ".self_attn.k_norm.weight", core::DType::BF16, {kHd});
    }
    const std::vector<std::tuple<std::string, int64_t, int64_t>> mods = {
        {p + ".self_attn.q_proj", kHeads * kHd, kH}, {p + ".self_attn.k_proj", kKv * kHd, kH},
        {p + ".self_attn.v_proj", kKv * kHd, kH},    {p + ".self_attn.o_proj", kH, kHeads * kHd},
        {p + ".mlp.gate_proj", kI, kH},              {p + ".mlp.up_proj", kI, kH},
        {p + ".mlp.down_proj", kH, kI}};
    for (const auto& [name, n, k] : mods) write_module(h, name, n, k, kind_of(name));
  }
  if (!tied || kind_of("lm_head") != Kind::Dense) write_module(h, "lm_head", kV, kH, kind_of("lm_head"));
  return h;
}

/// Headers of a Qwen3-MoE model (every layer sparse, router `mlp.gate`, per-expert gate/up/down).
inline TensorHeaders moe_headers(const KindOf& kind_of) {
  TensorHeaders h;
  put(h, "model.embed_tokens.weight", core::DType::BF16, {kV, kH});
  put(h, "model.norm.weight", core::DType::BF16, {kH});
  write_module(h, "lm_head", kV, kH, kind_of("lm_head"));
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    for (const char* n : {".input_layernorm.weight", ".post_attention_layernorm.weight"}) put(h, p + n, core::DType::BF16, {kH});
    for (const char* n : {".self_attn.q_norm.weight", ".self_attn.k_norm.weight"}) put(h, p + n, core::DType::BF16, {kHd});
    std::vector<std::tuple<std::string, int64_t, int64_t>> mods = {
        {p + ".self_attn.q_proj", kHeads * kHd, kH}, {p + ".self_attn.k_proj", kKv * kHd, kH},
        {p + ".self_attn.v_proj", kKv * kHd, kH},    {p + ".self_attn.o_proj", kH, kHeads * kHd},
        {p + ".mlp.gate", kE, kH}};
    for (int64_t e = 0; e < kE; ++e) {
      const std::string x = p + ".mlp.experts." + std::to_string(e);
      mods.emplace_back(x + ".gate_proj", kMoeI, kH);
      mods.emplace_back(x + ".up_proj", kMoeI, kH);
      mods.emplace_back(x + ".down_proj", kH, kMoeI);
    }
    for (const auto& [name, n, k] : mods) write_module(h, name, n, k, kind_of(name));
  }
  return h;
}

/// Everything of `kind` except lm_head (dense) — the usual llm-compressor result.
inline KindOf all_but_head(Kind kind) {
  return [kind](const std::string& m) { return m == "lm_head" ? Kind::Dense : kind; };
}

/// "cpu" (the host), or "smNN" (a dry run for that compute capability), as `explain --device` names them.
inline DeviceCaps device(const std::string& label) {
  return label == "cpu" ? resolve_device(DeviceChoice::Cpu) : dry_run_device(std::stoi(label.substr(2)));
}

/// The kernel catalogue of `--device label` ("cpu", "sm90", …), as the app and the loader make it; one per label
/// for the life of the test binary.
inline const KernelCatalogue* catalogue(const std::string& label) {
  static std::map<std::string, std::unique_ptr<KernelCatalogue>> made;
  std::unique_ptr<KernelCatalogue>& c = made[label];
  if (!c) c = backends::catalogue_for(device(label));
  return c.get();
}

}  // namespace fp4serve::plan::testing
