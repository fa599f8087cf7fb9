// SPDX-License-Identifier: Apache-2.0
#include "model/model_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "fp4serve/error.h"

namespace fp4serve::model {
namespace {

using nlohmann::json;

int64_t require_int(const json& c, const char* key) {
  if (!c.contains(key) || !c[key].is_number_integer()) {
    throw FormatError(fmt::format("config.json: '{}' must be an integer, found {}", key,
                                  c.contains(key) ? c[key].dump() : "nothing"));
  }
  const int64_t v = c[key].get<int64_t>();
  if (v <= 0) throw FormatError(fmt::format("config.json: '{}' = {} must be positive", key, v));
  return v;
}

double number_or(const json& c, const char* key, double fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  if (!c[key].is_number()) throw FormatError(fmt::format("config.json: '{}' must be a number, found {}", key, c[key].dump()));
  return c[key].get<double>();
}

bool bool_or(const json& c, const char* key, bool fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  if (!c[key].is_boolean()) throw FormatError(fmt::format("config.json: '{}' must be a boolean, found {}", key, c[key].dump()));
  return c[key].get<bool>();
}

std::vector<int32_t> token_ids(const json& value) {
  std::vector<int32_t> ids;
  if (value.is_number_integer()) ids.push_back(value.get<int32_t>());
  if (value.is_array()) {
    for (const auto& v : value) {
      if (v.is_number_integer()) ids.push_back(v.get<int32_t>());
    }
  }
  return ids;
}

int64_t sliding_window_or_zero(const json& c) {
  return c.contains("sliding_window") && c["sliding_window"].is_number_integer() ? c["sliding_window"].get<int64_t>() : 0;
}

// The MoE settings: counts from the dimensions the plan also reads, rules from the architecture's row.
void parse_moe(const json& c, const checkpoint::ArchitectureSpec& spec, const checkpoint::ModelDims& d, ModelConfig& m) {
  MoeConfig& moe = m.moe;
  moe.num_experts = d.num_experts;
  moe.top_k = require_int(c, "num_experts_per_tok");
  if (moe.top_k > moe.num_experts) {
    throw FormatError(fmt::format("config.json: num_experts_per_tok {} exceeds the {} experts", moe.top_k,
                                  moe.num_experts));
  }
  moe.intermediate_size = d.moe_intermediate_size;
  moe.routed_scaling_factor = static_cast<float>(number_or(c, "routed_scaling_factor", 1.0));
  moe.router = spec.router_kind;
  switch (spec.renormalize) {
    case checkpoint::TopKRenormalize::Never: moe.renormalize = false; break;
    case checkpoint::TopKRenormalize::Always: moe.renormalize = true; break;
    case checkpoint::TopKRenormalize::FromConfig: moe.renormalize = bool_or(c, "norm_topk_prob", false); break;
  }
  moe.activation = spec.expert_activation;
  if (moe.activation == ExpertActivation::SwigluOai) moe.swiglu_limit = static_cast<float>(number_or(c, "swiglu_limit", 7.0));
  moe.decoder_sparse_step = d.decoder_sparse_step;
  moe.mlp_only_layers = d.mlp_only_layers;
  moe.shared_expert_intermediate_size = d.shared_expert_intermediate_size;
}

// GPT-OSS alternates sliding and full attention as `layer_types` lists them.
void parse_layer_types(const json& c, ModelConfig& m) {
  const int64_t window = sliding_window_or_zero(c);
  if (!c.contains("layer_types") || !c["layer_types"].is_array()) {
    throw FormatError(fmt::format("config.json: {} needs 'layer_types' (a list of sliding_attention/full_attention)",
                                  m.architecture_name));
  }
  const json& types = c["layer_types"];
  if (static_cast<int64_t>(types.size()) != m.num_layers) {
    throw FormatError(fmt::format("config.json: 'layer_types' has {} entries where num_hidden_layers is {}",
                                  types.size(), m.num_layers));
  }
  for (const json& t : types) {
    const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
    if (type == "sliding_attention") {
      if (window <= 0) throw FormatError("config.json: 'layer_types' has sliding_attention but 'sliding_window' is not a positive integer");
      m.layer_sliding_window.push_back(window);
    } else if (type == "full_attention") {
      m.layer_sliding_window.push_back(0);
    } else {
      throw FormatError(fmt::format("config.json: 'layer_types' entry '{}' is neither sliding_attention nor full_attention", type));
    }
  }
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (moe.num_experts == 0) return false;
  if (std::find(moe.mlp_only_layers.begin(), moe.mlp_only_layers.end(), layer) != moe.mlp_only_layers.end()) return false;
  return moe.decoder_sparse_step <= 1 || (layer + 1) % moe.decoder_sparse_step == 0;
}

int64_t ModelConfig::sliding_window_of(int64_t layer) const {
  if (layer_sliding_window.empty()) return sliding_window;
  return layer_sliding_window.at(static_cast<size_t>(layer));
}

std::vector<int64_t> ModelConfig::layer_windows() const {
  std::vector<int64_t> windows;
  for (int64_t l = 0; l < num_layers; ++l) windows.push_back(sliding_window_of(l));
  return windows;
}

ModelConfig parse_model_config(const json& c) {
  // Dimensions (and the unknown-architecture refusal listing the table) come from the parser the plan uses.
  const checkpoint::ModelDims d = checkpoint::read_model_dims(c);
  const checkpoint::ArchitectureSpec& spec = checkpoint::architecture_spec(d.architecture);
  ModelConfig m;
  m.architecture_name = d.architecture;
  const std::string act = c.value("hidden_act", std::string("silu"));
  if (act != "silu") {
    throw UnsupportedError(fmt::format("config.json: hidden_act '{}' is not supported for {} (expected silu)", act,
                                       m.architecture_name));
  }
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (m.dtype.empty() && c.contains(key) && c[key].is_string()) m.dtype = c[key].get<std::string>();
  }
  m.hidden_size = d.hidden_size;
  m.intermediate_size = d.intermediate_size;
  m.num_layers = d.num_hidden_layers;
  m.num_heads = d.num_attention_heads;
  m.num_kv_heads = d.num_key_value_heads;
  m.vocab_size = d.vocab_size;
  m.head_dim = d.head_dim;
  if (m.num_heads % m.num_kv_heads != 0) {
    throw FormatError(fmt::format("config.json: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                                  m.num_heads, m.num_kv_heads));
  }
  m.max_position_embeddings = c.contains("max_position_embeddings") ? require_int(c, "max_position_embeddings") : 2048;
  m.rms_norm_eps = static_cast<float>(number_or(c, "rms_norm_eps", 1e-6));
  m.rope_theta = parse_rope_theta(c);
  m.rope_scaling = parse_rope_scaling(c);
  m.tie_word_embeddings = d.tie_word_embeddings;
  m.mlp_bias = d.mlp_bias;
  m.qk_norm = spec.qk_norm;
  m.attention_sinks = spec.attention_sinks;
  if (spec.qkv_bias_always) {
    m.attention_bias = true;  // Qwen2 families always have q/k/v biases and no o_proj bias
  } else {
    m.attention_bias = d.attention_bias;
    m.o_proj_bias = m.attention_bias;
  }
  switch (spec.sliding_window) {
    case checkpoint::SlidingWindowRule::None: break;
    case checkpoint::SlidingWindowRule::FromConfig: m.sliding_window = sliding_window_or_zero(c); break;
    case checkpoint::SlidingWindowRule::LayerTypes: parse_layer_types(c, m); break;
    case checkpoint::SlidingWindowRule::RefuseUseSlidingWindow:
      if (bool_or(c, "use_sliding_window", false)) {
        throw UnsupportedError(fmt::format("config.json: {} use_sliding_window=true is not supported yet", m.architecture_name));
      }
      break;
  }
  if (spec.granite_multipliers) {
    m.embedding_multiplier = static_cast<float>(number_or(c, "embedding_multiplier", 1.0));
    m.residual_multiplier = static_cast<float>(number_or(c, "residual_multiplier", 1.0));
    m.attention_scale = static_cast<float>(number_or(c, "attention_multiplier", 0.0));
    m.logits_scaling = static_cast<float>(number_or(c, "logits_scaling", 1.0));
  }
  if (spec.experts != checkpoint::ExpertLayout::None) parse_moe(c, spec, d, m);
  if (m.attention_scale == 0.0f) m.attention_scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
  if (c.contains("eos_token_id")) m.eos_token_ids = token_ids(c["eos_token_id"]);
  if (c.contains("bos_token_id") && c["bos_token_id"].is_number_integer()) m.bos_token_id = c["bos_token_id"].get<int32_t>();
  return m;
}

}  // namespace fp4serve::model
