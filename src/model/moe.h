// SPDX-License-Identifier: Apache-2.0
// The sparse mixture-of-experts feed-forward block (Mixtral, Qwen2/3-MoE, GraniteMoe, GPT-OSS), written against
// model::Backend (router GEMM, routing, row gather, expert GEMMs, activation, weighted scatter-add), so it runs
// on every backend.
// Whatever the checkpoint layout (split per expert, fused 3-D with gate|up halves, GPT-OSS interleaved rows),
// each expert is prepared into one layout: a LinearGroup w13 = gate | up halves [2I, H] and a LinearGroup
// down [H, I], each keeping its own scheme and per-shard global scales. Every expert activation of the
// architecture table is gated; an architecture with non-gated experts has no row there and is refused when
// config.json is read (checkpoint::architecture_spec).
// A step routes every token, groups the tokens by expert, runs each expert's GEMMs with M = its routed tokens,
// and adds the weighted outputs in expert order (transformers' index_add_ order).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/decoder.h"
#include "model/linear_group.h"
#include "model/model_config.h"
#include "model/router.h"
#include "model/weight_source.h"

namespace fp4serve::model {

/// One expert in the prepared layout.
struct ExpertWeights {
  LinearGroup w13;   ///< [2I, H] gate rows then up rows
  LinearGroup down;  ///< [H, I]
};

/// Qwen2-MoE's always-on shared expert: a SwiGLU MLP scaled by sigmoid(gate(h)) with gate [1, H].
struct SharedExpertWeights {
  LinearGroup w13;
  LinearGroup down;
  LinearGroup gate;
};

struct MoeSettings {
  RouterSettings router;
  ExpertActivation activation = ExpertActivation::SiluGated;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
};

class MoeBlock final : public FeedForward {
 public:
  /// `router`: [E, H] (with bias for GPT-OSS); `experts`: E entries. `name` (e.g. "model.layers.3 MoE") prefixes
  /// errors. The weights are uploaded to `backend` (which must outlive the block). Throws UsageError for a null
  /// backend, FormatError when the expert count differs from settings.router.num_experts or an
  /// expert's sizes disagree with the router's H or with the other experts (w13 [2·I, H], down [H, I]);
  /// what Backend::upload_linear throws.
  MoeBlock(std::string name, MoeSettings settings, LinearGroup router, std::vector<ExpertWeights> experts,
           std::optional<SharedExpertWeights> shared, Backend* backend);
  /// The same with the experts read one at a time: `load_expert(i)` for i = 0 … expert_count − 1, in order, each
  /// uploaded before the next is read, so only one expert's checkpoint-order weights (and reordered copies of them)
  /// are alive at once. Throws as above and what `load_expert` throws.
  MoeBlock(std::string name, MoeSettings settings, LinearGroup router, int64_t expert_count,
           const std::function<ExpertWeights(int64_t)>& load_expert, std::optional<SharedExpertWeights> shared,
           Backend* backend);
  ~MoeBlock() override;

  /// out[m, H] = Σ_k weight_k · expert_k(h) (+ sigmoid(gate(h)) · shared(h)). h, out: [m, H] fp32 in the
  /// backend's memory.
  void forward(const float* h, int64_t m, float* out, ActivationObserver* observer) const override;

  int64_t num_experts() const { return static_cast<int64_t>(experts_.size()); }
  int64_t intermediate_size() const { return intermediate_; }
  int64_t hidden_size() const { return hidden_; }

 private:
  struct Expert {
    std::unique_ptr<BackendLinear> w13, down;
  };
  std::string name_;
  MoeSettings settings_;
  Backend* backend_ = nullptr;
  std::unique_ptr<BackendLinear> router_;
  std::vector<Expert> experts_;
  std::unique_ptr<BackendLinear> shared_w13_, shared_down_, shared_gate_;
  int64_t hidden_ = 0;
  int64_t intermediate_ = 0;
  int64_t shared_intermediate_ = 0;
};

/// Builds decoder layer `layer`'s MoE block on `backend` (non-null) from the modules the
/// plan lists for it (router, per-expert or fused 3-D experts, shared expert), with the routing and activation
/// rules of `config`. Throws FormatError naming the layer when the checkpoint's expert count or sizes disagree
/// with config.json, and what `weights` and the backend throw.
std::unique_ptr<MoeBlock> make_moe_block(const ModelConfig& config, const WeightSource& weights, int64_t layer,
                                         Backend* backend);

/// The first workspace slot the MoE block uses (the decoder's slots lie below).
inline constexpr int kMoeWorkspace = 16;

}  // namespace fp4serve::model
