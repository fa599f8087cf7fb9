// SPDX-License-Identifier: Apache-2.0
// The numeric description of a decoder model, read from config.json: the dimensions by
// checkpoint::read_model_dims (the plan reads the same), the rules of each architecture (`architectures[0]`) from
// its row of the architecture table (checkpoint/architecture.h), never inferred from which tensors exist.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/architecture.h"
#include "model/rope_table.h"

namespace fp4serve::model {

// The architecture facts (router kind, expert activation, …) are the checkpoint module's, written once there.
using checkpoint::ExpertActivation;
using checkpoint::RouterKind;

/// Mixture-of-experts settings; num_experts = 0 for dense models.
struct MoeConfig {
  int64_t num_experts = 0;
  int64_t top_k = 0;                     ///< num_experts_per_tok
  int64_t intermediate_size = 0;         ///< expert width I (moe_intermediate_size, else intermediate_size)
  RouterKind router = RouterKind::SoftmaxTopK;
  bool renormalize = false;              ///< SoftmaxTopK: divide the k probabilities by their sum
  float routed_scaling_factor = 1.0f;    ///< multiplies the routing weights (config `routed_scaling_factor`)
  ExpertActivation activation = ExpertActivation::SiluGated;
  float swiglu_alpha = 1.702f;           ///< GPT-OSS (HF GptOssExperts.alpha)
  float swiglu_limit = 7.0f;             ///< GPT-OSS config `swiglu_limit`
  int64_t shared_expert_intermediate_size = 0;  ///< Qwen2-MoE shared expert, 0 = none
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
};

struct ModelConfig {
  std::string architecture_name;  ///< config.json `architectures[0]`, a row of checkpoint::supported_architectures()
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
  RopeScaling rope_scaling;
  int64_t sliding_window = 0;     ///< 0 = full attention
  /// Per-layer override of sliding_window (GPT-OSS `layer_types`): empty = every layer uses sliding_window.
  std::vector<int64_t> layer_sliding_window;
  bool attention_sinks = false;   ///< GPT-OSS: `self_attn.sinks` [num_heads] join each softmax
  bool tie_word_embeddings = false;
  /// config.json `dtype` (transformers ≥ 4.56) or `torch_dtype`: the dtype the model was saved and is usually run
  /// in ("bfloat16", "float16", "float32"), "" when absent. --kv-cache-dtype auto follows it.
  std::string dtype;
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
  MoeConfig moe;

  /// True when `layer` runs a sparse MoE block (Qwen-MoE: not in mlp_only_layers and (layer + 1) % step == 0;
  /// the other MoE families: every layer; dense models: none) — the rule of checkpoint::ModelDims::is_moe_layer.
  bool is_moe_layer(int64_t layer) const;
  /// The attention window of `layer` (0 = full).
  int64_t sliding_window_of(int64_t layer) const;
  /// sliding_window_of every layer, in order (KvCacheSpec::layer_windows: which layers share KV blocks).
  std::vector<int64_t> layer_windows() const;
};

/// Parses config.json. Throws UnsupportedError listing the supported architectures for an unknown
/// `architectures[0]` or an unsupported `hidden_act`; FormatError naming the key for a missing or mistyped field
/// or inconsistent dimensions (heads not dividing, kv heads not dividing heads, num_experts_per_tok not in
/// 1 … num_experts, layer_types of the wrong length or with an unknown entry).
ModelConfig parse_model_config(const nlohmann::json& config);

}  // namespace fp4serve::model
