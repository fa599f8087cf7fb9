// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/architecture.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <optional>

#include "fp4serve/error.h"

namespace fp4serve::checkpoint {
namespace {

using nlohmann::json;

// Module names follow the Hugging Face checkpoints of each family (FORMATS.md §4, §5).
constexpr std::array<ArchitectureSpec, 10> kSpecs{{
    {.name = "LlamaForCausalLM"},
    {.name = "MistralForCausalLM", .sliding_window = SlidingWindowRule::FromConfig},
    {.name = "Qwen2ForCausalLM", .qkv_bias_always = true, .sliding_window = SlidingWindowRule::RefuseUseSlidingWindow},
    {.name = "Qwen3ForCausalLM", .qk_norm = true, .sliding_window = SlidingWindowRule::RefuseUseSlidingWindow},
    {.name = "GraniteForCausalLM", .granite_multipliers = true},
    {.name = "MixtralForCausalLM", .experts = ExpertLayout::PerExpert, .experts_key = "num_local_experts",
     .moe_prefix = "block_sparse_moe", .router = "block_sparse_moe.gate", .renormalize = TopKRenormalize::Always,
     .sliding_window = SlidingWindowRule::FromConfig},
    {.name = "Qwen2MoeForCausalLM", .experts = ExpertLayout::PerExpert, .qkv_bias_always = true,
     .shared_expert = true, .experts_key = "num_experts", .experts_key_alias = "num_local_experts",
     .moe_prefix = "mlp", .router = "mlp.gate", .renormalize = TopKRenormalize::FromConfig,
     .sliding_window = SlidingWindowRule::RefuseUseSlidingWindow},
    {.name = "Qwen3MoeForCausalLM", .experts = ExpertLayout::PerExpert, .qk_norm = true,
     .experts_key = "num_experts", .experts_key_alias = "num_local_experts", .moe_prefix = "mlp",
     .router = "mlp.gate", .renormalize = TopKRenormalize::FromConfig,
     .sliding_window = SlidingWindowRule::RefuseUseSlidingWindow},
    {.name = "GraniteMoeForCausalLM", .experts = ExpertLayout::Fused3d, .gate_up = GateUpLayout::ConcatenatedHalves,
     .experts_key = "num_local_experts", .moe_prefix = "block_sparse_moe", .router = "block_sparse_moe.router.layer",
     .router_kind = RouterKind::TopKSoftmax, .granite_multipliers = true},
    {.name = "GptOssForCausalLM", .experts = ExpertLayout::Fused3d, .gate_up = GateUpLayout::InterleavedRows,
     .attention_sinks = true, .attention_bias_default = true, .experts_key = "num_local_experts",
     .moe_prefix = "mlp", .router = "mlp.router", .router_kind = RouterKind::TopKSoftmax,
     .expert_activation = ExpertActivation::SwigluOai, .sliding_window = SlidingWindowRule::LayerTypes},
}};

int64_t read_int(const json& config, const char* key, std::string_view arch, std::optional<int64_t> fallback) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    if (fallback) return *fallback;
    throw FormatError(fmt::format("config.json: '{}' is missing (required for {})", key, arch));
  }
  if (!it->is_number_integer() || it->get<int64_t>() < 0) {
    throw FormatError(fmt::format("config.json: '{}' is {}, expected a non-negative integer ({})", key, it->dump(), arch));
  }
  return it->get<int64_t>();
}

bool read_bool(const json& config, const char* key, bool fallback) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw FormatError(fmt::format("config.json: '{}' is {}, expected true or false", key, it->dump()));
  return it->get<bool>();
}

void require_positive(int64_t value, const char* key, std::string_view arch) {
  if (value <= 0) throw FormatError(fmt::format("config.json: '{}' is {}, expected a positive integer ({})", key, value, arch));
}

// Module and tensor names of the Llama-family checkpoints, every architecture in kSpecs (transformers'
// modeling_llama.py and its copies). A family with other names gets its own table here.
constexpr std::string_view kLayers = "model.layers.";
constexpr std::string_view kAttention = "self_attn";

std::string_view leaf_name(ModuleRole role) {
  switch (role) {
    case ModuleRole::QProj: return "self_attn.q_proj";
    case ModuleRole::KProj: return "self_attn.k_proj";
    case ModuleRole::VProj: return "self_attn.v_proj";
    case ModuleRole::OProj: return "self_attn.o_proj";
    case ModuleRole::GateProj: return "mlp.gate_proj";
    case ModuleRole::UpProj: return "mlp.up_proj";
    case ModuleRole::DownProj: return "mlp.down_proj";
    case ModuleRole::SharedExpertGate: return "mlp.shared_expert.gate_proj";
    case ModuleRole::SharedExpertUp: return "mlp.shared_expert.up_proj";
    case ModuleRole::SharedExpertDown: return "mlp.shared_expert.down_proj";
    case ModuleRole::SharedExpertRouter: return "mlp.shared_expert_gate";
    case ModuleRole::Embedding:
    case ModuleRole::LmHead:
    case ModuleRole::ExpertGate:
    case ModuleRole::ExpertUp:
    case ModuleRole::ExpertDown:
    case ModuleRole::ExpertsGateUp:
    case ModuleRole::ExpertsDown:
    case ModuleRole::Router: break;
  }
  return {};
}

}  // namespace

std::string layer_name(const ArchitectureSpec& /*spec*/, int64_t layer) {
  return std::string(kLayers) + std::to_string(layer);
}

std::string attention_module(const ArchitectureSpec& spec, int64_t layer) {
  return layer_name(spec, layer) + "." + std::string(kAttention);
}

std::string module_name(const ArchitectureSpec& spec, ModuleRole role, int64_t layer) {
  if (role == ModuleRole::Embedding) return "model.embed_tokens";
  if (role == ModuleRole::LmHead) return "lm_head";
  const std::string_view leaf = leaf_name(role);
  if (leaf.empty()) {
    throw UsageError(fmt::format("{}: {} modules are listed by describe_model, not named by role", spec.name,
                                 module_role_name(role)));
  }
  return layer_name(spec, layer) + "." + std::string(leaf);
}

std::string tensor_name(const ArchitectureSpec& spec, TensorRole role, int64_t layer) {
  switch (role) {
    case TensorRole::Embedding: return module_name(spec, ModuleRole::Embedding, -1) + ".weight";
    case TensorRole::InputNorm: return layer_name(spec, layer) + ".input_layernorm.weight";
    case TensorRole::PostAttentionNorm: return layer_name(spec, layer) + ".post_attention_layernorm.weight";
    case TensorRole::QNorm: return attention_module(spec, layer) + ".q_norm.weight";
    case TensorRole::KNorm: return attention_module(spec, layer) + ".k_norm.weight";
    case TensorRole::Sinks: return attention_module(spec, layer) + ".sinks";
    case TensorRole::FinalNorm: return "model.norm.weight";
  }
  return {};
}

std::string_view module_role_name(ModuleRole role) {
  switch (role) {
    case ModuleRole::Embedding: return "embedding";
    case ModuleRole::LmHead: return "lm_head";
    case ModuleRole::QProj: return "q_proj";
    case ModuleRole::KProj: return "k_proj";
    case ModuleRole::VProj: return "v_proj";
    case ModuleRole::OProj: return "o_proj";
    case ModuleRole::GateProj: return "gate_proj";
    case ModuleRole::UpProj: return "up_proj";
    case ModuleRole::DownProj: return "down_proj";
    case ModuleRole::ExpertGate: return "expert gate";
    case ModuleRole::ExpertUp: return "expert up";
    case ModuleRole::ExpertDown: return "expert down";
    case ModuleRole::ExpertsGateUp: return "experts gate_up (3-D)";
    case ModuleRole::ExpertsDown: return "experts down (3-D)";
    case ModuleRole::SharedExpertGate: return "shared expert gate";
    case ModuleRole::SharedExpertUp: return "shared expert up";
    case ModuleRole::SharedExpertDown: return "shared expert down";
    case ModuleRole::SharedExpertRouter: return "shared expert gate (scalar)";
    case ModuleRole::Router: return "router";
  }
  return "?";
}

bool ModelDims::is_moe_layer(int64_t layer) const {
  if (num_experts == 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return decoder_sparse_step <= 1 || (layer + 1) % decoder_sparse_step == 0;
}

std::span<const ArchitectureSpec> supported_architectures() { return kSpecs; }

const ArchitectureSpec& architecture_spec(std::string_view architecture) {
  for (const ArchitectureSpec& spec : kSpecs) {
    if (spec.name == architecture) return spec;
  }
  std::vector<std::string_view> names;
  for (const ArchitectureSpec& spec : kSpecs) names.push_back(spec.name);
  throw UnsupportedError(fmt::format("config.json: architecture '{}' is not supported; supported: {}", architecture,
                                     fmt::join(names, ", ")));
}

ModelDims read_model_dims(const json& config) {
  if (!config.is_object()) throw FormatError("config.json is missing or not an object; the architecture comes from it");
  auto arch_it = config.find("architectures");
  if (arch_it == config.end() || !arch_it->is_array() || arch_it->empty() || !(*arch_it)[0].is_string()) {
    throw FormatError("config.json: 'architectures' is missing or not a list of strings");
  }
  ModelDims d;
  d.architecture = (*arch_it)[0].get<std::string>();
  const ArchitectureSpec& spec = architecture_spec(d.architecture);
  const std::string_view a = spec.name;
  d.hidden_size = read_int(config, "hidden_size", a, std::nullopt);
  d.num_hidden_layers = read_int(config, "num_hidden_layers", a, std::nullopt);
  d.num_attention_heads = read_int(config, "num_attention_heads", a, std::nullopt);
  d.vocab_size = read_int(config, "vocab_size", a, std::nullopt);
  d.intermediate_size = read_int(config, "intermediate_size", a, std::nullopt);
  require_positive(d.hidden_size, "hidden_size", a);
  require_positive(d.num_hidden_layers, "num_hidden_layers", a);
  require_positive(d.num_attention_heads, "num_attention_heads", a);
  require_positive(d.vocab_size, "vocab_size", a);
  require_positive(d.intermediate_size, "intermediate_size", a);
  d.num_key_value_heads = read_int(config, "num_key_value_heads", a, d.num_attention_heads);
  require_positive(d.num_key_value_heads, "num_key_value_heads", a);
  const bool has_head_dim = config.contains("head_dim") && !config["head_dim"].is_null();
  if (!has_head_dim && d.hidden_size % d.num_attention_heads != 0) {
    throw FormatError(fmt::format("config.json: hidden_size {} is not divisible by num_attention_heads {} and there is "
                                  "no head_dim ({})", d.hidden_size, d.num_attention_heads, a));
  }
  d.head_dim = read_int(config, "head_dim", a, d.hidden_size / d.num_attention_heads);
  require_positive(d.head_dim, "head_dim", a);
  d.tie_word_embeddings = read_bool(config, "tie_word_embeddings", false);
  d.attention_bias = read_bool(config, "attention_bias", spec.attention_bias_default);
  d.mlp_bias = read_bool(config, "mlp_bias", false);
  if (spec.experts != ExpertLayout::None) {
    std::string key(spec.experts_key);
    if (!spec.experts_key_alias.empty() && !config.contains(key)) key = std::string(spec.experts_key_alias);
    d.num_experts = read_int(config, key.c_str(), a, std::nullopt);
    require_positive(d.num_experts, key.c_str(), a);
    d.num_experts_per_tok = read_int(config, "num_experts_per_tok", a, int64_t{0});
    d.moe_intermediate_size = read_int(config, "moe_intermediate_size", a, d.intermediate_size);
    require_positive(d.moe_intermediate_size, "moe_intermediate_size", a);
    d.decoder_sparse_step = read_int(config, "decoder_sparse_step", a, int64_t{1});
    if (auto it = config.find("mlp_only_layers"); it != config.end() && !it->is_null()) {
      if (!it->is_array()) throw FormatError("config.json: 'mlp_only_layers' is not a list of layer indices");
      for (const json& v : *it) {
        if (!v.is_number_integer()) throw FormatError("config.json: 'mlp_only_layers' holds a non-integer");
        d.mlp_only_layers.push_back(v.get<int64_t>());
      }
    }
    if (spec.shared_expert) {
      d.shared_expert_intermediate_size = read_int(config, "shared_expert_intermediate_size", a, std::nullopt);
      require_positive(d.shared_expert_intermediate_size, "shared_expert_intermediate_size", a);
    }
  }
  return d;
}

namespace {

// Appends modules and non-linear tensors in checkpoint naming. Returns indices, never references: later adds
// may reallocate the vector.
struct Builder {
  const ArchitectureSpec& spec;
  const ModelDims& d;
  ModelLayout& out;
  ExpertNaming naming = ExpertNaming::Native;

  size_t add(std::string name, ModuleRole role, int64_t layer, int64_t n, int64_t k, std::string fusion = {},
             bool bias = false, std::string_view cls = "Linear") {
    ModuleInfo m;
    m.name = std::move(name);
    m.role = role;
    m.layer = layer;
    m.out_features = n;
    m.in_features = k;
    m.fusion_group = std::move(fusion);
    m.class_name = cls;
    m.has_bias = bias;
    m.dense_weight = m.name + ".weight";
    out.modules.push_back(std::move(m));
    return out.modules.size() - 1;
  }

  void norm(std::string name, int64_t size) { out.others.push_back({std::move(name), {size}, "rmsnorm weight", false, false}); }

  void attention(int64_t layer) {
    const int64_t q = d.num_attention_heads * d.head_dim;
    const int64_t kv = d.num_key_value_heads * d.head_dim;
    const bool qkv_bias = spec.qkv_bias_always || d.attention_bias;
    const std::string a = attention_module(spec, layer);
    const auto name = [&](ModuleRole r) { return module_name(spec, r, layer); };
    add(name(ModuleRole::QProj), ModuleRole::QProj, layer, q, d.hidden_size, a + ".qkv_proj", qkv_bias);
    add(name(ModuleRole::KProj), ModuleRole::KProj, layer, kv, d.hidden_size, a + ".qkv_proj", qkv_bias);
    add(name(ModuleRole::VProj), ModuleRole::VProj, layer, kv, d.hidden_size, a + ".qkv_proj", qkv_bias);
    add(name(ModuleRole::OProj), ModuleRole::OProj, layer, d.hidden_size, q, {}, d.attention_bias);
    if (spec.qk_norm) {
      norm(tensor_name(spec, TensorRole::QNorm, layer), d.head_dim);
      norm(tensor_name(spec, TensorRole::KNorm, layer), d.head_dim);
    }
    if (spec.attention_sinks) {
      out.others.push_back({tensor_name(spec, TensorRole::Sinks, layer), {d.num_attention_heads}, "attention sinks", false, false});
    }
    // Some older exports saved the rotary buffer; it is recomputed from rope_theta, so it is dropped.
    out.others.push_back({a + ".rotary_emb.inv_freq", {d.head_dim / 2}, "rotary inv_freq buffer", true, true});
  }

  void dense_mlp(int64_t layer, int64_t width, ModuleRole gate, ModuleRole up, ModuleRole down, bool bias) {
    const std::string g = module_name(spec, gate, layer);
    const std::string fused = g.substr(0, g.rfind('.')) + ".gate_up_proj";
    add(g, gate, layer, width, d.hidden_size, fused, bias);
    add(module_name(spec, up, layer), up, layer, width, d.hidden_size, fused, bias);
    add(module_name(spec, down, layer), down, layer, d.hidden_size, width, {}, bias);
  }

  void per_expert(const std::string& p, int64_t layer) {
    const bool mixtral = spec.name == "MixtralForCausalLM" && naming == ExpertNaming::Native;
    const std::string base = p + "." + std::string(spec.moe_prefix) + ".experts.";
    const int64_t i = d.moe_intermediate_size;
    // Linearized GPT-OSS experts keep their biases as Linear biases.
    const bool bias = spec.gate_up == GateUpLayout::InterleavedRows;
    for (int64_t e = 0; e < d.num_experts; ++e) {
      const std::string x = base + std::to_string(e);
      const std::string w13 = x + (mixtral ? ".w13" : ".gate_up_proj");
      out.modules[add(x + (mixtral ? ".w1" : ".gate_proj"), ModuleRole::ExpertGate, layer, i, d.hidden_size, w13, bias)].expert = e;
      out.modules[add(x + (mixtral ? ".w3" : ".up_proj"), ModuleRole::ExpertUp, layer, i, d.hidden_size, w13, bias)].expert = e;
      out.modules[add(x + (mixtral ? ".w2" : ".down_proj"), ModuleRole::ExpertDown, layer, d.hidden_size, i, {}, bias)].expert = e;
    }
  }

  void fused_experts(const std::string& p, int64_t layer) {
    const bool granite = spec.gate_up == GateUpLayout::ConcatenatedHalves;
    const bool gpt_oss = spec.gate_up == GateUpLayout::InterleavedRows;
    const std::string base = p + (granite ? ".block_sparse_moe." : ".mlp.experts.");
    const std::string_view cls = granite ? "GraniteMoeParallelExperts" : "GptOssExperts";
    const int64_t i = d.moe_intermediate_size;
    const size_t gate_up = add(base + (granite ? "input_linear" : "gate_up_proj"), ModuleRole::ExpertsGateUp, layer,
                               2 * i, d.hidden_size, {}, gpt_oss, cls);
    const size_t down = add(base + (granite ? "output_linear" : "down_proj"), ModuleRole::ExpertsDown, layer,
                            d.hidden_size, i, {}, gpt_oss, cls);
    for (size_t idx : {gate_up, down}) {
      ModuleInfo& m = out.modules[idx];
      m.experts = d.num_experts;
      if (gpt_oss) {  // "…experts.gate_up_proj_blocks"; the dense weight "…experts.gate_up_proj" is [E, K, N]
        m.separator = '_';
        m.dense_weight = m.name;
        m.dense_weight_in_out = true;
      }
    }
  }

  void moe(const std::string& p, int64_t layer) {
    const bool gpt_oss = spec.gate_up == GateUpLayout::InterleavedRows;
    const size_t router = add(p + "." + std::string(spec.router), ModuleRole::Router, layer, d.num_experts,
                              d.hidden_size, {}, gpt_oss, gpt_oss ? "GptOssTopKRouter" : "Linear");
    if (spec.gate_up == GateUpLayout::ConcatenatedHalves) out.modules[router].runtime_name = p + ".block_sparse_moe.router";
    if (spec.experts == ExpertLayout::PerExpert || naming == ExpertNaming::Linearized) {
      per_expert(p, layer);
    } else {
      fused_experts(p, layer);
    }
    if (spec.shared_expert) {
      dense_mlp(layer, d.shared_expert_intermediate_size, ModuleRole::SharedExpertGate, ModuleRole::SharedExpertUp,
                ModuleRole::SharedExpertDown, false);
      add(module_name(spec, ModuleRole::SharedExpertRouter, layer), ModuleRole::SharedExpertRouter, layer, 1, d.hidden_size);
    }
  }
};

}  // namespace

std::string_view expert_naming_name(ExpertNaming naming) {
  switch (naming) {
    case ExpertNaming::Native: return "native";
    case ExpertNaming::Linearized: return "linearized per-expert (LLM Compressor)";
  }
  return "?";
}

ExpertNaming detect_expert_naming(const ModelDims& dims, const std::function<bool(std::string_view)>& has_tensor_prefix) {
  const ArchitectureSpec& spec = architecture_spec(dims.architecture);
  if (spec.experts == ExpertLayout::None) return ExpertNaming::Native;
  const bool native_is_linearized = spec.experts == ExpertLayout::PerExpert && spec.name != "MixtralForCausalLM";
  if (native_is_linearized) return ExpertNaming::Native;
  for (int64_t layer = 0; layer < dims.num_hidden_layers; ++layer) {
    if (!dims.is_moe_layer(layer)) continue;
    const std::string prefix = fmt::format("model.layers.{}.{}.experts.0.gate_proj.", layer, spec.moe_prefix);
    return has_tensor_prefix(prefix) ? ExpertNaming::Linearized : ExpertNaming::Native;
  }
  return ExpertNaming::Native;
}

ModelLayout describe_model(const json& config, ExpertNaming naming) {
  ModelLayout out;
  out.dims = read_model_dims(config);
  out.spec = &architecture_spec(out.dims.architecture);
  out.expert_naming = naming;
  const ModelDims& d = out.dims;
  Builder b{*out.spec, d, out, naming};
  const ArchitectureSpec& spec = *out.spec;
  b.add(module_name(spec, ModuleRole::Embedding, -1), ModuleRole::Embedding, -1, d.vocab_size, d.hidden_size, {},
        false, "Embedding");
  for (int64_t layer = 0; layer < d.num_hidden_layers; ++layer) {
    const std::string p = layer_name(spec, layer);
    b.norm(tensor_name(spec, TensorRole::InputNorm, layer), d.hidden_size);
    b.norm(tensor_name(spec, TensorRole::PostAttentionNorm, layer), d.hidden_size);
    b.attention(layer);
    if (d.is_moe_layer(layer)) {
      b.moe(p, layer);
    } else {
      b.dense_mlp(layer, d.intermediate_size, ModuleRole::GateProj, ModuleRole::UpProj, ModuleRole::DownProj, d.mlp_bias);
    }
  }
  b.norm(tensor_name(spec, TensorRole::FinalNorm, -1), d.hidden_size);
  ModuleInfo& head =
      out.modules[b.add(module_name(spec, ModuleRole::LmHead, -1), ModuleRole::LmHead, -1, d.vocab_size, d.hidden_size)];
  if (d.tie_word_embeddings) {
    head.tied = true;
    head.dense_weight = tensor_name(spec, TensorRole::Embedding, -1);
  }
  return out;
}

}  // namespace fp4serve::checkpoint
