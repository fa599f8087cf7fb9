// SPDX-License-Identifier: Apache-2.0
// Token sampling from fp32 logits: penalties, temperature, top-k, top-p, min-p, seeded RNG. Semantics follow
// the engines users compare with: repetition_penalty as transformers (divide positive logits, multiply negative
// ones, over prompt + output tokens), presence/frequency penalties as OpenAI/vLLM (over output tokens only).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace fp4serve::runtime {

struct SamplingParams {
  float temperature = 1.0f;         ///< 0 → greedy (argmax, lowest id on ties)
  int top_k = 0;                    ///< ≤ 0 → off
  float top_p = 1.0f;               ///< 1 → off
  float min_p = 0.0f;               ///< 0 → off: drop tokens with p < min_p · p_max
  float repetition_penalty = 1.0f;  ///< 1 → off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;     ///< none → a random seed
  /// OpenAI logit_bias: added to these tokens' logits before anything else (ids outside the row are skipped).
  std::vector<std::pair<int32_t, float>> logit_bias;
  /// vLLM min_tokens: until this many tokens were observed, `min_tokens_blocked` (EOS, stop ids) get −inf.
  int64_t min_tokens = 0;
  std::vector<int32_t> min_tokens_blocked;

  /// Throws UsageError naming the field when a value is out of range (temperature < 0, top_p ∉ (0, 1],
  /// min_p ∉ [0, 1], repetition_penalty ≤ 0, penalties ∉ [−2, 2]).
  void validate() const;
};

/// Fields of generation_config.json that set sampling defaults (do_sample, temperature, top_k, top_p, min_p,
/// repetition_penalty); `do_sample: false` (or absent with no temperature) means greedy, as transformers does.
/// The caller overrides whatever the user set explicitly.
SamplingParams sampling_defaults(const nlohmann::json& generation_config);

/// What an OpenAI-compatible server applies to the fields a request omits, derived from a generation_config.json
/// as vLLM derives it (ModelConfig.get_diff_sampling_param with --generation-config auto or a folder):
/// temperature, top_k, top_p, min_p and repetition_penalty are taken where the file sets them to a value other
/// than transformers' GenerationConfig default (1.0, 50, 1.0, unset, 1.0: `to_diff_dict` drops the others);
/// `do_sample` is ignored; max_new_tokens becomes the default max_tokens. Every field not taken keeps the neutral
/// value OpenAI and vLLM use (temperature 1.0: a request without one samples). A null or non-object config (vLLM's
/// --generation-config vllm) gives the neutral defaults alone.
struct ServingDefaults {
  SamplingParams sampling;
  std::optional<int64_t> max_tokens;  ///< max_new_tokens; none: up to the context
  std::vector<std::string> taken;     ///< the fields taken from the config, in the order above ("temperature=0.6")
};
ServingDefaults serving_defaults(const nlohmann::json& generation_config);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  /// Records the prompt (for repetition_penalty).
  void observe_prompt(std::span<const int32_t> tokens);
  /// Records a generated token (for all penalties).
  void observe(int32_t token);

  /// Picks the next token from `logits` [vocab] fp32 (modified in place: penalties applied), drawn from
  /// `distribution(logits)` by an exponential race (argmax p_i / E_i, E_i ~ Exp(1) from a counter-based generator
  /// keyed by seed, call number and token id), so a seeded sequence of calls is reproducible and logits perturbed
  /// in their last bits (another batch shape runs other kernels) almost never change a draw. Throws UsageError
  /// when `logits` is empty.
  int32_t sample(std::span<float> logits);

  /// The distribution `sample` draws from, [vocab] probabilities summing to 1 (0 for filtered tokens), for
  /// `logits` [vocab] fp32 (modified in place like `sample`). Order: logit_bias, the min_tokens block, then as
  /// transformers' generate: repetition penalty, presence/frequency penalties, then temperature, top-k (tokens tied with the k-th logit are kept,
  /// as TopKLogitsWarper and vLLM do), top-p (the smallest most-likely set whose mass reaches top_p; among
  /// equal probabilities the lower id ranks first), min-p. Temperature 0 gives a one-hot at the greedy token.
  /// NaN logits count as −inf; when no logit is finite the result is one-hot at the lowest id.
  /// Consumes no randomness. Throws UsageError when `logits` is empty.
  std::vector<float> distribution(std::span<float> logits);

 private:
  // NaN → −inf, then the repetition, presence and frequency penalties, in place.
  void prepare(std::span<float> logits) const;
  // Fills candidates_ with (probability, id) of the tokens that survive the filters, most likely first; the
  // probabilities are those before filtering (callers renormalize by their sum).
  void filter(std::span<const float> logits);

  SamplingParams params_;
  uint64_t seed_ = 0;
  uint64_t draws_ = 0;
  std::unordered_set<int32_t> seen_;               // prompt + output
  std::unordered_map<int32_t, int> output_counts_;  // output only
  int64_t observed_ = 0;                            // output tokens so far (for min_tokens)
  std::vector<std::pair<float, int32_t>> candidates_;
};

/// Constrained decoding's mask (runtime/structured_output.h): sets logits[t] = −inf for every token t whose bit
/// is clear in `bitmask` (bit t % 32 of word t / 32, xgrammar's layout); tokens past the bitmask's
/// 32 · bitmask.size() are masked too. Applied to a sequence's row before Sampler::sample, so every filter and
/// penalty sees only allowed tokens (vLLM applies the grammar bitmask to the logits before its sampler).
void apply_token_bitmask(std::span<float> logits, std::span<const int32_t> bitmask);

/// A token's log-probability under the model's raw logits and the best alternatives, as the OpenAI API reports
/// them (vLLM's default: before penalties, temperature and filtering).
struct TokenLogprobs {
  double logprob = 0.0;
  std::vector<std::pair<int32_t, double>> top;  ///< (id, logprob), highest first, ties by lower id
};

/// log_softmax(logits)[token] and the `top_n` highest entries, in float64 (max-subtracted log-sum-exp).
/// Throws UsageError when `logits` is empty or `token` is outside it.
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top_n);

}  // namespace fp4serve::runtime
