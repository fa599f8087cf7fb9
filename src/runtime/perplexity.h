// SPDX-License-Identifier: Apache-2.0
// Sliding-window perplexity (the transformers "perplexity of fixed-length models" method) and, against a base
// model, the mean KL divergence and top-1 agreement that llama.cpp reports to judge quantization quality.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "model/forward_model.h"

namespace fp4serve::runtime {

struct PerplexityOptions {
  int64_t context = 512;  ///< window length in tokens
  int64_t stride = 256;   ///< window step; tokens already scored by the previous window are not scored again
};

struct PerplexityResult {
  double perplexity = 0.0;      ///< exp(mean negative log-likelihood) over the scored tokens
  int64_t tokens_scored = 0;
  double mean_kld = 0.0;        ///< mean KL(base ‖ model) per scored token; 0 without a base
  double top1_agreement = 0.0;  ///< fraction of scored tokens where both argmaxes agree; 0 without a base
  double base_perplexity = 0.0; ///< the base model's perplexity on the same tokens; 0 without a base
};

/// Scores `tokens` with `decoder` (and `base` when not null, which must share the vocabulary). Windows start at
/// 0, stride, 2·stride, …; window [b, e) scores the tokens after the previous window's end, each predicted from
/// all tokens before it inside the window. `progress(done, total)` is called after each window.
/// Throws UsageError when there are fewer than 2 tokens, stride ≤ 0 or stride > context, or the vocabularies differ.
PerplexityResult perplexity(const model::ForwardModel& decoder, const model::ForwardModel* base, std::span<const int32_t> tokens,
                            const PerplexityOptions& options, const std::function<void(int64_t, int64_t)>& progress);

}  // namespace fp4serve::runtime
