// SPDX-License-Identifier: Apache-2.0
// MoE routing: router logits → the k experts of each token and their combine weights, in fp32 and in the order
// of operations of transformers' modeling code for each family (rounding of fp32 softmax sums follows the same
// sequence, so the selected experts agree even when two probabilities are close).
#pragma once

#include <cstdint>

#include "model/model_config.h"

namespace fp4serve::model {

struct RouterSettings {
  RouterKind kind = RouterKind::SoftmaxTopK;
  int64_t num_experts = 0;  ///< E
  int64_t top_k = 0;        ///< k, 1 ≤ k ≤ E
  bool renormalize = false;  ///< SoftmaxTopK only: divide the k probabilities by their sum
  float scaling = 1.0f;      ///< routed_scaling_factor, multiplies every weight last
};

/// Routes m tokens. logits: [m, E] fp32 (router bias already added, GPT-OSS); experts: [m, k] int32 expert
/// indices (descending by weight; ties to the lower index); weights: [m, k] fp32.
/// SoftmaxTopK (MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock): p = softmax(logits) over all E, top-k of p,
///   then p / Σ_k p when renormalize.
/// TopKSoftmax (GraniteMoeTopKGating, GptOssTopKRouter): top-k of the logits, softmax over those k.
/// Throws UsageError on null pointers, m < 0, or k outside 1 … E.
void route(const RouterSettings& settings, const float* logits, int64_t m, int32_t* experts, float* weights);

}  // namespace fp4serve::model
