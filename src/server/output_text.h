// SPDX-License-Identifier: Apache-2.0
// Generated ids → text for one request: incremental detokenization, then stop strings held back until they can
// no longer match (runtime::StopMatcher), so a stop string is never partially sent. Also keeps the ids and the
// logprob entries of the tokens that made it into the output (not those after a matched stop string).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/generator.h"
#include "server/openai_api.h"
#include "server/request_channel.h"
#include "server/text_codec.h"

namespace fp4serve::server {

class OutputText {
 public:
  /// `keep_special_tokens`: the text keeps special tokens (a tool-call parser reads them as markers).
  OutputText(const TextCodec& codec, const ApiRequest& api, bool keep_special_tokens = false)
      : codec_(codec), detok_(keep_special_tokens ? codec.detokenizer_keeping_special() : codec.detokenizer()),
        stops_(api.stop), keep_ids_(api.return_token_ids),
        keep_logprobs_(api.logprobs.has_value()) {}

  /// Text that became final with `update`'s tokens.
  std::string push(const ChannelUpdate& update) {
    std::string out;
    for (size_t i = 0; i < update.tokens.size(); ++i) {
      if (stops_.stopped()) break;
      const int32_t id = update.tokens[i];
      ++tokens_;
      if (keep_ids_) {
        ids_.push_back(id);
        all_ids_.push_back(id);
      }
      if (keep_logprobs_ && i < update.logprobs.size()) logprobs_.push_back(entry(update.logprobs[i], id));
      out += stops_.push(detok_->push(id));
    }
    return out;
  }
  std::string finish() {
    std::string tail = stops_.stopped() ? std::string() : stops_.push(detok_->flush());
    return tail + stops_.finish();
  }
  bool stopped() const { return stops_.stopped(); }
  int64_t tokens() const { return tokens_; }
  /// Ids since the last call (for token_ids in stream chunks).
  std::vector<int32_t> take_ids() { return std::exchange(ids_, {}); }
  /// Every id so far (for token_ids in a whole response).
  const std::vector<int32_t>& ids() const { return all_ids_; }
  /// Logprob entries since the last call.
  std::vector<LogprobEntry> take_logprobs() { return std::exchange(logprobs_, {}); }
  /// Ids or logprobs not yet sent although no text came with them (a multi-byte character still incomplete).
  bool has_pending() const { return !ids_.empty() || !logprobs_.empty(); }

 private:
  // A token's own text, decoded alone (as the logprobs of vLLM and OpenAI show it).
  std::string token_text(int32_t id) const {
    auto d = codec_.detokenizer();
    return d->push(id) + d->flush();
  }
  LogprobEntry entry(const runtime::TokenLogprobs& lp, int32_t id) const {
    LogprobEntry e{token_text(id), lp.logprob, {}};
    for (const auto& [tid, value] : lp.top) e.top.emplace_back(token_text(tid), value);
    return e;
  }

  const TextCodec& codec_;
  std::unique_ptr<Detokenizer> detok_;
  runtime::StopMatcher stops_;
  bool keep_ids_ = false;
  bool keep_logprobs_ = false;
  int64_t tokens_ = 0;
  std::vector<int32_t> ids_, all_ids_;
  std::vector<LogprobEntry> logprobs_;
};

}  // namespace fp4serve::server
