// SPDX-License-Identifier: Apache-2.0
// One request from prompt tokens to streamed text: prefill, then decode token by token with the sampler,
// stopping on EOS ids, stop strings or the token limit. The server's scheduler batches many of these; the
// CLI (`generate`, `chat`) runs one at a time through this loop.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "model/decoder.h"
#include "model/forward_model.h"
#include "runtime/sampler.h"
#include "text/tokenizer.h"

namespace fp4serve::runtime {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_new_tokens = 128;
  std::vector<std::string> stop;       ///< stop strings (not included in the output)
  std::vector<int32_t> eos_token_ids;  ///< generation ends when one is sampled (not included in the output)
  bool ignore_eos = false;
};

struct GenerationResult {
  std::string text;
  std::vector<int32_t> tokens;         ///< generated ids (EOS excluded)
  std::string finish_reason;           ///< "stop" (EOS or stop string) or "length"
  int64_t prompt_tokens = 0;
  /// Prompt tokens whose keys and values came from the cache's prefix cache (a multiple of its block size; 0 with
  /// prefix caching off): the prefill computed prompt_tokens − cached_tokens positions.
  int64_t cached_tokens = 0;
  double prefill_seconds = 0.0;        ///< time to first token (prompt forward + first sample)
  double decode_seconds = 0.0;         ///< time for the remaining tokens
};

/// Holds back the tail of streamed text that could still become a stop string, so that a stop string is
/// never partially emitted.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stop);
  /// Appends `text`; returns what may be emitted now. After a stop string is found, `stopped()` is true and
  /// the returned text ends right before it.
  std::string push(std::string_view text);
  /// The held-back text at the end of generation (empty after a stop).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stop_;
  size_t hold_ = 0;
  std::string pending_;
  bool stopped_ = false;
};

/// Runs `request` in a free slot of `cache` (released afterwards). With the cache's prefix caching on
/// (KvCache::set_prefix_caching), the longest cached prefix of the prompt is taken from the cache and only the
/// rest is prefilled; the blocks this run fills stay cached after it, so a later prompt that extends this one (a
/// chat's next turn) computes only its new tokens. `on_text` receives each piece of new text; returning false
/// cancels generation (finish_reason "abort"). Throws UsageError when the prompt is empty, no slot is free, or
/// prompt + max_new_tokens exceeds the cache length.
GenerationResult generate(const model::ForwardModel& decoder, model::KvCache& cache, const text::Tokenizer& tokenizer,
                          const GenerationRequest& request, const std::function<bool(std::string_view)>& on_text);

}  // namespace fp4serve::runtime
