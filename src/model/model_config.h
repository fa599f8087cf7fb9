// SPDX-License-Identifier: Apache-2.0
// The numeric description of a decoder model, read from config.json with one explicit rule set per
// architecture (`architectures[0]`), never inferred from which tensors exist.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/rope.h"

namespace fp4serve::model {

enum class Architecture {
  Llama,    ///< LlamaForCausalLM (SmolLM2, TinyLlama, Llama 2/3)
  Mistral,  ///< MistralForCausalLM (optional sliding window)
  Qwen2,    ///< Qwen2ForCausalLM: q/k/v projections carry biases
  Qwen3,    ///< Qwen3ForCausalLM: per-head RMSNorm on q and k before RoPE
  Granite,  ///< GraniteForCausalLM: embedding/residual/attention multipliers, logits scaling
};

/// The architectures this build runs, as config.json names them.
const std::vector<std::string>& supported_architectures();

struct ModelConfig {
  Architecture architecture = Architecture::Llama;
  std::string architecture_name;  ///< config.json `architectures[0]`
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;           ///< `head_dim` when given, else hidden_size / num_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  kernels::RopeScaling rope_scaling;
  int64_t sliding_window = 0;     ///< 0 = full attention
  bool tie_word_embeddings = false;
  bool attention_bias = false;    ///< q/k/v (and o when `attention_bias` says so for Llama) carry biases
  bool o_proj_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;           ///< Qwen3
  // Granite multipliers (1 elsewhere); attention_scale is 1/sqrt(head_dim) unless the config overrides it.
  float embedding_multiplier = 1.0f;
  float residual_multiplier = 1.0f;
  float attention_scale = 0.0f;
  float logits_scaling = 1.0f;    ///< logits are divided by this
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
};

/// Parses config.json. Throws UnsupportedError listing the supported architectures for an unknown
/// `architectures[0]` or an unsupported `hidden_act`; FormatError naming the key for a missing or mistyped field
/// or inconsistent dimensions (heads not dividing, kv heads not dividing heads).
ModelConfig parse_model_config(const nlohmann::json& config);

}  // namespace fp4serve::model
