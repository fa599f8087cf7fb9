// SPDX-License-Identifier: Apache-2.0
#include "model/model_config.h"

#include <fmt/format.h>

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
    {"GraniteForCausalLM", Architecture::Granite},
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

}  // namespace

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
      m.attention_bias = bool_or(c, "attention_bias", false);
      m.o_proj_bias = m.attention_bias;
      break;
    case Architecture::Mistral:
      m.sliding_window = c.contains("sliding_window") && c["sliding_window"].is_number_integer()
                             ? c["sliding_window"].get<int64_t>()
                             : 0;
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
  if (m.architecture == Architecture::Granite) {
    m.embedding_multiplier = static_cast<float>(number_or(c, "embedding_multiplier", 1.0));
    m.residual_multiplier = static_cast<float>(number_or(c, "residual_multiplier", 1.0));
    m.attention_scale = static_cast<float>(number_or(c, "attention_multiplier", 0.0));
    m.logits_scaling = static_cast<float>(number_or(c, "logits_scaling", 1.0));
  }
  if (m.attention_scale == 0.0f) m.attention_scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
  if (c.contains("eos_token_id")) m.eos_token_ids = token_ids(c["eos_token_id"]);
  if (c.contains("bos_token_id") && c["bos_token_id"].is_number_integer()) m.bos_token_id = c["bos_token_id"].get<int32_t>();
  return m;
}

}  // namespace fp4serve::model
