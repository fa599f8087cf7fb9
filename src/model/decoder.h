// SPDX-License-Identifier: Apache-2.0
// The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Granite and their MoE relatives Mixtral, Qwen2/3-MoE,
// GraniteMoe, GPT-OSS, whose feed-forward is a model/moe.h block) and its forward step over a batch of
// sequences of different lengths: every linear runs once over all tokens of the batch (M = total tokens),
// attention runs per sequence over its KV-cache slot.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/rope.h"
#include "model/forward_model.h"
#include "model/kv_cache.h"
#include "model/linear_group.h"
#include "model/model_config.h"
#include "model/weight_source.h"

namespace fp4serve::model {

/// A feed-forward block: dense MLP here; MoE blocks implement the same interface.
class FeedForward {
 public:
  virtual ~FeedForward() = default;
  /// out[m, hidden] = FFN(h[m, hidden]); `observer` (may be null) sees the input of each linear group.
  virtual void forward(const float* h, int64_t m, float* out, ActivationObserver* observer) const = 0;
};

class Decoder final : public ForwardModel {
 public:
  /// Builds every layer from `weights`. Throws what the weight source throws, naming the tensor or module.
  Decoder(ModelConfig config, const WeightSource& weights);

  const ModelConfig& config() const override { return config_; }

  /// A KV cache sized for this model.
  KvCache make_cache(int64_t max_seq_len, int max_slots) const override;

  /// The ForwardModel step on the CPU kernels (host KV cache).
  std::vector<float> forward(std::span<const SequenceChunk> batch, KvCache& cache) const override;

  /// Installs (or, with nullptr, removes) an observer of every linear group's input; not thread-safe.
  void set_observer(ActivationObserver* observer) { observer_ = observer; }

 private:
  struct Layer {
    std::vector<float> input_norm;
    std::vector<float> post_attention_norm;
    std::vector<float> q_norm;  // Qwen3 only, [head_dim]
    std::vector<float> k_norm;
    std::vector<float> sinks;  // GPT-OSS only, [num_heads]
    int64_t sliding_window = 0;
    LinearGroup qkv;
    LinearGroup o_proj;
    AttentionTransforms transforms;  // q_attn / k_cache, after RoPE
    std::unique_ptr<FeedForward> ffn;
  };

  ModelConfig config_;
  core::TensorView embed_tokens_;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  LinearGroup lm_head_;
  kernels::RopeCache rope_;
  ActivationObserver* observer_ = nullptr;
};

/// Reads a [n] BF16/F16/F32 tensor as fp32. Throws FormatError when the shape is not [n].
std::vector<float> load_vector(const WeightSource& weights, const std::string& name, int64_t n);

}  // namespace fp4serve::model
