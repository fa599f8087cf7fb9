// SPDX-License-Identifier: Apache-2.0
// The one decoder of every architecture fp4serve runs (Llama, Mistral, Qwen2, Qwen3, Granite and their MoE
// relatives Mixtral, Qwen2/3-MoE, GraniteMoe, GPT-OSS, whose feed-forward is a model/moe.h block), written once
// against model::Backend (backend.h) so that the same layers run on the CPU and on a GPU. A forward step runs a
// batch of sequences of different lengths: every linear runs once over all tokens of the batch (M = total
// tokens), attention runs per sequence over its KV-cache slot. Module and tensor names come from the
// architecture table (checkpoint/architecture.h) by role; the architecture's numbers from ModelConfig.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/backend.h"
#include "model/forward_model.h"
#include "model/kv_cache.h"
#include "model/linear_group.h"
#include "model/model_config.h"
#include "model/weight_source.h"

namespace fp4serve::model {

/// A feed-forward block on a backend: the dense MLP (decoder.cpp) or a MoE block (moe.h).
class FeedForward {
 public:
  virtual ~FeedForward() = default;
  /// out[m, hidden] = FFN(h[m, hidden]), both in the block's backend memory; `observer` (may be null) sees the
  /// input of each linear group (copied to the host when the backend's memory is not).
  virtual void forward(const float* h, int64_t m, float* out, ActivationObserver* observer) const = 0;
};

class Decoder final : public ForwardModel {
 public:
  /// Builds every layer from `weights` on `backend` (uploading weights there). Throws FormatError naming the
  /// tensor or module for shapes that disagree with config.json, UnsupportedError naming the op and the layer for
  /// what the backend cannot run, and what the weight source throws.
  Decoder(ModelConfig config, const WeightSource& weights, std::unique_ptr<Backend> backend);
  /// Tensor parallelism: `weights` is this rank's shard (WeightSource::attention_heads) and `comm` (kept, must
  /// outlive the decoder; null or size 1: a whole model) sums the row-parallel partial outputs, one all-reduce
  /// after o_proj and one after the MLP / MoE block per layer. Every rank must run the same steps.
  Decoder(ModelConfig config, const WeightSource& weights, std::unique_ptr<Backend> backend, dist::Communicator* comm);
  ~Decoder() override;
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  const ModelConfig& config() const override { return config_; }

  /// A KV cache sized for this model in its backend's memory, with each layer's window (spec's sliding_window
  /// and layer_windows are replaced by the layers' own).
  using ForwardModel::make_cache;
  KvCache make_cache(const KvCacheSpec& spec) const override;

  /// The ForwardModel step on the backend. Not thread-safe: the backend holds the step's scratch.
  std::vector<float> forward(std::span<const SequenceChunk> batch, KvCache& cache) const override;

  /// Installs (or, with nullptr, removes) an observer of every linear group's input; not thread-safe.
  void set_observer(ActivationObserver* observer) { observer_ = observer; }

  const Backend& backend() const { return *backend_; }
  Backend& backend() { return *backend_; }

 private:
  struct Layer {
    std::unique_ptr<BackendVector> input_norm, post_attention_norm;
    std::unique_ptr<BackendVector> q_norm, k_norm;  // Qwen3, [head_dim]
    std::unique_ptr<BackendVector> sinks;           // GPT-OSS, [num_heads]
    int64_t sliding_window = 0;
    std::unique_ptr<BackendLinear> qkv, o_proj;
    std::vector<std::unique_ptr<BackendTransform>> query_transforms, key_transforms;  // q_attn / k_cache
    std::unique_ptr<FeedForward> ffn;
  };

  ModelConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<BackendEmbedding> embed_tokens_;
  std::vector<Layer> layers_;
  std::unique_ptr<BackendVector> final_norm_;
  std::unique_ptr<BackendLinear> lm_head_;
  std::unique_ptr<BackendRope> rope_;
  ActivationObserver* observer_ = nullptr;
  dist::Communicator* comm_ = nullptr;  // null unless size > 1
  int64_t num_heads_ = 0, num_kv_heads_ = 0;  // this rank's (all of config's without tensor parallelism)
  bool capturable_ = false;  // decode steps may be captured (FlatBatch::capturable): no MoE layer
};

/// Reads a [n] BF16/F16/F32 tensor as fp32. Throws FormatError when the shape is not [n].
std::vector<float> load_vector(const WeightSource& weights, const std::string& name, int64_t n);

/// Shows x [m, k] in backend memory to `observer` (no-op when null).
void observe(ActivationObserver* observer, Backend& backend, const BackendLinear& w, const float* x, int64_t m);

}  // namespace fp4serve::model
