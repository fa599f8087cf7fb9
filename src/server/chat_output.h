// SPDX-License-Identifier: Apache-2.0
// A chat choice's text → OpenAI's message or stream deltas when the request has tools or the server a reasoning
// parser: content, reasoning_content and tool_calls, as vLLM returns them. tool_choice auto parses the model's own
// call format (tool_calls.h); required / named were decoded under their JSON schema (tool_request.h) and the
// whole output is the calls; none, or no tools, leaves the text as content.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "server/openai_api.h"
#include "server/tool_calls.h"

namespace fp4serve::server {

/// Appends the delta fields of `more` to `into` (strings concatenated, tool_calls appended; a piece that continues
/// the last call's arguments is joined to it).
void merge_delta(nlohmann::json& into, const nlohmann::json& more);

class ChoiceParser {
 public:
  /// `calls`: kStreamed for a stream (delta()), kWhole for a whole reply (message()).
  ChoiceParser(const ApiRequest& api, const ServeLimits& limits, CallOutput calls);

  /// False: plain text, the reply is built as without tools.
  bool active() const { return active_; }
  /// Whether the detokenizer must keep special tokens (the family's markers are special tokens).
  bool keeps_special_tokens() const { return keep_special_; }

  /// Streaming: the delta fields ({"content"}, {"reasoning_content"}, {"tool_calls": [...]}) for the next piece
  /// of text; an empty object when nothing is final yet. A call streams as OpenAI's do: its first entry {index, id,
  /// type: "function", function: {name, arguments: ""}} once the model has written the name, then entries {index,
  /// function: {arguments}} with the arguments' text as it is generated.
  nlohmann::json delta(std::string_view text);
  /// The rest, at the end of the output.
  nlohmann::json finish_delta();

  /// A whole reply: the message ({"role", "content" (null when empty beside calls), "tool_calls",
  /// "reasoning_content"}) for the complete `text`.
  nlohmann::json message(const std::string& text);

  /// OpenAI's finish_reason: "tool_calls" when calls were returned for auto or required and the model stopped.
  std::string finish_reason(const std::string& reason) const;

 private:
  nlohmann::json to_delta(ParsedOutput out);
  nlohmann::json tool_call_json(const ToolCall& call, std::optional<int> index) const;
  void add_deltas(nlohmann::json& calls, const std::vector<ToolCallDelta>& deltas);

  bool active_ = false;
  bool keep_special_ = false;
  bool reasoning_ = false;
  std::optional<ToolRequest::Choice> choice_;
  std::string function_;  // kNamed
  bool parallel_ = true;
  std::optional<OutputParser> parser_;
  CallOutput mode_ = CallOutput::kWhole;
  std::string forced_text_;  // required / named: the whole output is the calls
  std::optional<ForcedCallStream> forced_stream_;
  int calls_ = 0;
};

}  // namespace fp4serve::server
