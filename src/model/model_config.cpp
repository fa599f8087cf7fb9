// SPDX-License-Identifier: Apache-2.0
#include "model/model_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "fp4serve/error.h"

namespace fp4serve::model {
namespace {

using nlohmann::json;

struct ArchitectureRow {
  const char* name;
  Architecture architecture;
};

constexpr ArchitectureRow kArchitectures[] = {
    {"LlamaForCausalLM", Architecture::Llama},     {"MistralForCausalLM", Architecture::Mistral},
    {"Qwen2ForCausalLM", Architecture::Qwen2},     {"Qwen3ForCausalLM", Architecture::Qwen3},
    {"GraniteForCausalLM", Architecture::Granite}, {"MixtralForCausalLM", Architecture::Mixtral},
    {"Qwen2MoeForCausalLM", Architecture::Qwen2Moe}, {"Qwen3MoeForCausalLM", Architecture::Qwen3Moe},
    {"GraniteMoeForCausalLM", Architecture::GraniteMoe}, {"GptOssForCausalLM", Architecture::GptOss},
};

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

// The MoE rules of each family (transformers' modeling files): expert count key, router, activation.
void parse_moe(const json& c, ModelConfig& m) {
  MoeConfig& moe = m.moe;
  const bool qwen = m.architecture == Architecture::Qwen2Moe || m.architecture == Architecture::Qwen3Moe;
  const char* experts_key = qwen && c.contains("num_experts") ? "num_experts" : "num_local_experts";
  moe.num_experts = require_int(c, experts_key);
  moe.top_k = require_int(c, "num_experts_per_tok");
  if (moe.top_k > moe.num_experts) {
    throw FormatError(fmt::format("config.json: num_experts_per_tok {} exceeds {} {}", moe.top_k, experts_key,
                                  moe.num_experts));
  }
  moe.intermediate_size = c.contains("moe_intermediate_size") ? require_int(c, "moe_intermediate_size") : m.intermediate_size;
  moe.routed_scaling_factor = static_cast<float>(number_or(c, "routed_scaling_factor", 1.0));
  switch (m.architecture) {
    case Architecture::Mixtral:
      moe.renormalize = true;  // MixtralSparseMoeBlock always divides the top-k probabilities by their sum
      break;
    case Architecture::Qwen2Moe:
    case Architecture::Qwen3Moe:
      moe.renormalize = bool_or(c, "norm_topk_prob", false);
      moe.decoder_sparse_step = c.contains("decoder_sparse_step") ? require_int(c, "decoder_sparse_step") : 1;
      if (c.contains("mlp_only_layers") && c["mlp_only_layers"].is_array()) {
        for (const auto& v : c["mlp_only_layers"]) {
          if (!v.is_number_integer()) throw FormatError("config.json: 'mlp_only_layers' holds a non-integer");
          moe.mlp_only_layers.push_back(v.get<int64_t>());
        }
      }
      if (m.architecture == Architecture::Qwen2Moe) {
        moe.shared_expert_intermediate_size = require_int(c, "shared_expert_intermediate_size");
      }
      break;
    case Architecture::GraniteMoe:
      moe.router = RouterKind::TopKSoftmax;
      break;
    case Architecture::GptOss:
      moe.router = RouterKind::TopKSoftmax;
      moe.activation = ExpertActivation::SwigluOai;
      moe.swiglu_limit = static_cast<float>(number_or(c, "swiglu_limit", 7.0));
      break;
    case Architecture::Llama:
    case Architecture::Mistral:
    case Architecture::Qwen2:
    case Architecture::Qwen3:
    case Architecture::Granite:
      break;
  }
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

bool is_gated(ExpertActivation a) {
  switch (a) {
    case ExpertActivation::SiluGated:
    case ExpertActivation::SwigluOai: return true;
    case ExpertActivation::ReluSquared:
    case ExpertActivation::Silu: return false;
  }
  return true;
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (moe.num_experts == 0) return false;
  if (std::find(moe.mlp_only_layers.begin(), moe.mlp_only_layers.end(), layer) != moe.mlp_only_layers.end()) return false;
  return moe.decoder_sparse_step <= 1 || (layer + 1) % moe.decoder_sparse_step == 0;
}

int64_t ModelConfig::sliding_window_of(int64_t layer) const {
  if (layer_sliding_window.empty()) return sliding_window;
  return layer_sliding_window.at(static_cast<size_t>(layer));
}

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& row : kArchitectures) out.emplace_back(row.name);
    return out;
  }();
  return names;
}

ModelConfig parse_model_config(const json& c) {
  if (!c.is_object()) throw FormatError("config.json: missing or not an object");
  if (!c.contains("architectures") || !c["architectures"].is_array() || c["architectures"].empty() ||
      !c["architectures"][0].is_string()) {
    throw FormatError("config.json: 'architectures' must be a non-empty list of strings");
  }
  ModelConfig m;
  m.architecture_name = c["architectures"][0].get<std::string>();
  bool known = false;
  for (const auto& row : kArchitectures) {
    if (m.architecture_name == row.name) {
      m.architecture = row.architecture;
      known = true;
    }
  }
  if (!known) {
    throw UnsupportedError(fmt::format("config.json: architecture '{}' is not supported; supported: {}",
                                       m.architecture_name, fmt::join(supported_architectures(), ", ")));
  }
  const std::string act = c.value("hidden_act", std::string("silu"));
  if (act != "silu") {
    throw UnsupportedError(fmt::format("config.json: hidden_act '{}' is not supported for {} (expected silu)", act,
                                       m.architecture_name));
  }
  m.hidden_size = require_int(c, "hidden_size");
  m.intermediate_size = require_int(c, "intermediate_size");
  m.num_layers = require_int(c, "num_hidden_layers");
  m.num_heads = require_int(c, "num_attention_heads");
  m.num_kv_heads = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                       ? require_int(c, "num_key_value_heads")
                       : m.num_heads;
  m.vocab_size = require_int(c, "vocab_size");
  m.head_dim = c.contains("head_dim") && !c["head_dim"].is_null() ? require_int(c, "head_dim")
                                                                  : m.hidden_size / m.num_heads;
  if (!c.contains("head_dim") && m.hidden_size % m.num_heads != 0) {
    throw FormatError(fmt::format("config.json: hidden_size {} is not divisible by num_attention_heads {}",
                                  m.hidden_size, m.num_heads));
  }
  if (m.num_heads % m.num_kv_heads != 0) {
    throw FormatError(fmt::format("config.json: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                                  m.num_heads, m.num_kv_heads));
  }
  m.max_position_embeddings = c.contains("max_position_embeddings") ? require_int(c, "max_position_embeddings") : 2048;
  m.rms_norm_eps = static_cast<float>(number_or(c, "rms_norm_eps", 1e-6));
  m.rope_theta = number_or(c, "rope_theta", 10000.0);
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
    m.rope_theta = number_or(c["rope_parameters"], "rope_theta", m.rope_theta);
  }
  m.rope_scaling = kernels::parse_rope_scaling(c);
  m.tie_word_embeddings = bool_or(c, "tie_word_embeddings", false);
  m.mlp_bias = bool_or(c, "mlp_bias", false);
  switch (m.architecture) {
    case Architecture::Llama:
    case Architecture::Granite:
    case Architecture::GraniteMoe:
      m.attention_bias = bool_or(c, "attention_bias", false);
      m.o_proj_bias = m.attention_bias;
      break;
    case Architecture::Mistral:
    case Architecture::Mixtral:
      m.sliding_window = sliding_window_or_zero(c);
      break;
    case Architecture::GptOss:
      m.attention_bias = bool_or(c, "attention_bias", true);
      m.o_proj_bias = m.attention_bias;
      m.attention_sinks = true;
      parse_layer_types(c, m);
      break;
    case Architecture::Qwen2Moe:
      m.attention_bias = true;
      if (bool_or(c, "use_sliding_window", false)) {
        throw UnsupportedError("config.json: Qwen2-MoE use_sliding_window=true is not supported yet");
      }
      break;
    case Architecture::Qwen3Moe:
      m.qk_norm = true;
      m.attention_bias = bool_or(c, "attention_bias", false);
      m.o_proj_bias = m.attention_bias;
      if (bool_or(c, "use_sliding_window", false)) {
        throw UnsupportedError("config.json: Qwen3-MoE use_sliding_window=true is not supported yet");
      }
      break;
    case Architecture::Qwen2:
      m.attention_bias = true;  // Qwen2 always has q/k/v biases and no o_proj bias
      if (bool_or(c, "use_sliding_window", false)) {
        throw UnsupportedError("config.json: Qwen2 use_sliding_window=true is not supported yet");
      }
      break;
    case Architecture::Qwen3:
      m.qk_norm = true;
      m.attention_bias = bool_or(c, "attention_bias", false);
      m.o_proj_bias = m.attention_bias;
      if (bool_or(c, "use_sliding_window", false)) {
        throw UnsupportedError("config.json: Qwen3 use_sliding_window=true is not supported yet");
      }
      break;
  }
  if (m.architecture == Architecture::Granite || m.architecture == Architecture::GraniteMoe) {
    m.embedding_multiplier = static_cast<float>(number_or(c, "embedding_multiplier", 1.0));
    m.residual_multiplier = static_cast<float>(number_or(c, "residual_multiplier", 1.0));
    m.attention_scale = static_cast<float>(number_or(c, "attention_multiplier", 0.0));
    m.logits_scaling = static_cast<float>(number_or(c, "logits_scaling", 1.0));
  }
  switch (m.architecture) {
    case Architecture::Mixtral:
    case Architecture::Qwen2Moe:
    case Architecture::Qwen3Moe:
    case Architecture::GraniteMoe:
    case Architecture::GptOss: parse_moe(c, m); break;
    case Architecture::Llama:
    case Architecture::Mistral:
    case Architecture::Qwen2:
    case Architecture::Qwen3:
    case Architecture::Granite: break;
  }
  if (m.attention_scale == 0.0f) m.attention_scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
  if (c.contains("eos_token_id")) m.eos_token_ids = token_ids(c["eos_token_id"]);
  if (c.contains("bos_token_id") && c["bos_token_id"].is_number_integer()) m.bos_token_id = c["bos_token_id"].get<int32_t>();
  return m;
}

}  // namespace fp4serve::model
