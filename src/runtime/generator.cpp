// SPDX-License-Identifier: Apache-2.0
#include "runtime/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "fp4serve/error.h"

namespace fp4serve::runtime {

StopMatcher::StopMatcher(std::vector<std::string> stop) : stop_(std::move(stop)) {
  for (const auto& s : stop_) hold_ = std::max(hold_, s.size() > 0 ? s.size() - 1 : 0);
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  pending_ += text;
  size_t earliest = std::string::npos;
  for (const auto& s : stop_) {
    if (s.empty()) continue;
    const size_t at = pending_.find(s);
    earliest = std::min(earliest, at);
  }
  if (earliest != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, earliest);
    pending_.clear();
    return out;
  }
  if (pending_.size() <= hold_) return {};
  // Never split a UTF-8 sequence: move the cut back to a code-point boundary.
  size_t cut = pending_.size() - hold_;
  while (cut > 0 && (static_cast<unsigned char>(pending_[cut]) & 0xC0) == 0x80) --cut;
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

std::string StopMatcher::finish() {
  std::string out = stopped_ ? std::string() : pending_;
  pending_.clear();
  return out;
}

GenerationResult generate(const model::ForwardModel& decoder, model::KvCache& cache, const Tokenizer& tokenizer,
                          const GenerationRequest& request, const std::function<bool(std::string_view)>& on_text) {
  using clock = std::chrono::steady_clock;
  if (request.prompt.empty()) throw UsageError("generate: the prompt has no tokens");
  const auto prompt_len = static_cast<int64_t>(request.prompt.size());
  if (prompt_len + request.max_new_tokens > cache.max_seq_len()) {
    throw UsageError(fmt::format("generate: prompt ({} tokens) + max_new_tokens ({}) exceeds the context length {}",
                                 prompt_len, request.max_new_tokens, cache.max_seq_len()));
  }
  const int slot = cache.acquire();
  if (slot < 0) throw UsageError("generate: no free KV-cache slot");
  struct SlotGuard {
    model::KvCache& cache;
    int slot;
    ~SlotGuard() { cache.release(slot); }
  } guard{cache, slot};

  GenerationResult result;
  result.prompt_tokens = prompt_len;
  Sampler sampler(request.sampling);
  sampler.observe_prompt(request.prompt);
  StreamDecoder detok(tokenizer, /*skip_special_tokens=*/true);
  StopMatcher stops(request.stop);
  const int64_t vocab = decoder.config().vocab_size;

  const auto t0 = clock::now();
  model::SequenceChunk chunk{slot, 0, request.prompt, false};
  std::vector<float> logits = decoder.forward(std::span(&chunk, 1), cache);
  int64_t position = prompt_len;
  result.finish_reason = "length";
  bool first = true;
  auto t_first = t0;
  while (static_cast<int64_t>(result.tokens.size()) < request.max_new_tokens) {
    const int32_t token = sampler.sample(std::span(logits.data(), static_cast<size_t>(vocab)));
    if (first) {
      t_first = clock::now();
      first = false;
    }
    const bool is_eos = std::find(request.eos_token_ids.begin(), request.eos_token_ids.end(), token) !=
                        request.eos_token_ids.end();
    if (is_eos && !request.ignore_eos) {
      result.finish_reason = "stop";
      break;
    }
    sampler.observe(token);
    result.tokens.push_back(token);
    const std::string piece = stops.push(detok.push(token));
    result.text += piece;
    if (!piece.empty() && !on_text(piece)) {
      result.finish_reason = "abort";
      break;
    }
    if (stops.stopped()) {
      result.finish_reason = "stop";
      break;
    }
    if (static_cast<int64_t>(result.tokens.size()) >= request.max_new_tokens) break;
    model::SequenceChunk next{slot, position, std::span(&result.tokens.back(), 1), false};
    logits = decoder.forward(std::span(&next, 1), cache);
    ++position;
  }
  if (result.finish_reason != "abort") {
    std::string tail = stops.stopped() ? std::string() : stops.push(detok.flush());
    tail += stops.finish();
    result.text += tail;
    if (!tail.empty()) on_text(tail);
  }
  const auto t_end = clock::now();
  result.prefill_seconds = std::chrono::duration<double>(t_first - t0).count();
  result.decode_seconds = std::chrono::duration<double>(t_end - t_first).count();
  return result;
}

}  // namespace fp4serve::runtime
