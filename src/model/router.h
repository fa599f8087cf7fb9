// SPDX-License-Identifier: Apache-2.0
// MoE routing: router logits → the k experts of each token and their combine weights, in fp32 and in the order
// of operations of transformers' modeling code for each family (rounding of fp32 softmax sums follows the same
// sequence, so the selected experts agree even when two probabilities are close). The row softmax and top-k come
// from the backend that routes (RouterMath), so that host routing gives the numbers of that backend's own ops.
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

/// The two host row functions routing runs on. Both backends pass the CPU's (softmax_rows: max-subtracted, SIMD
/// fp32; top_k: descending, ties to the lower index, NaN last), so the same logits choose the same experts on both.
struct RouterMath {
  /// In place, each of `rows` rows of x [rows, n]: exp(x − max) / Σ exp(x − max) in fp32.
  void (*softmax_rows)(float* x, int64_t rows, int64_t n) = nullptr;
  /// The k largest of values[0 … n) in descending order (ties to the lower index) into indices and top_values.
  void (*top_k)(const float* values, int64_t n, int64_t k, int32_t* indices, float* top_values) = nullptr;
};

/// Routes m tokens with `math`'s softmax and top-k. logits: [m, E] fp32 (router bias already added, GPT-OSS);
/// experts: [m, k] int32 expert indices (descending by weight; ties to the lower index); weights: [m, k] fp32.
/// SoftmaxTopK (MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock): p = softmax(logits) over all E, top-k of p,
///   then p / Σ_k p when renormalize.
/// TopKSoftmax (GraniteMoeTopKGating, GptOssTopKRouter): top-k of the logits, softmax over those k.
/// Throws UsageError on null pointers (math's included), m < 0, or k outside 1 … E.
void route(const RouterSettings& settings, const float* logits, int64_t m, int32_t* experts, float* weights,
           const RouterMath& math);

}  // namespace fp4serve::model
