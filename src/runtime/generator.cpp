// SPDX-License-Identifier: Apache-2.0
#include "runtime/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "fp4serve/error.h"

namespace fp4serve::runtime {
namespace {

bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Length of `s` without a trailing UTF-8 sequence that is still incomplete (a piece may end mid-character when
// the caller streams raw bytes). Invalid bytes count as complete: holding them back could only delay them.
size_t without_incomplete_tail(const std::string& s) {
  size_t lead = s.size();
  while (lead > 0 && s.size() - lead < 3 && is_continuation(s[lead - 1])) --lead;
  if (lead == 0) return s.size();
  const auto b = static_cast<unsigned char>(s[lead - 1]);
  const size_t need = (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 1;
  return s.size() - (lead - 1) < need ? lead - 1 : s.size();
}

}  // namespace

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
  // Never split a UTF-8 sequence: move the cut back to a code-point boundary, also when no stop string needs
  // holding back (hold_ 0) and the text ends mid-character.
  size_t cut = std::min(pending_.size() - hold_, without_incomplete_tail(pending_));
  while (cut > 0 && cut < pending_.size() && is_continuation(pending_[cut])) --cut;
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

std::string StopMatcher::finish() {
  std::string out = stopped_ ? std::string() : pending_;
  pending_.clear();
  return out;
}

GenerationResult generate(const model::ForwardModel& decoder, model::KvCache& cache, const text::Tokenizer& tokenizer,
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
  text::StreamDecoder detok(tokenizer, /*skip_special_tokens=*/true);
  StopMatcher stops(request.stop);
  const int64_t vocab = decoder.config().vocab_size;

  const auto t0 = clock::now();
  result.cached_tokens = cache.match_prefix(slot, request.prompt);
  const std::span<const int32_t> prompt(request.prompt);
  model::SequenceChunk chunk{slot, result.cached_tokens, prompt.subspan(static_cast<size_t>(result.cached_tokens)),
                             false};
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
