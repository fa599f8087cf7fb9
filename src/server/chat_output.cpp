// SPDX-License-Identifier: Apache-2.0
#include "server/chat_output.h"

#include <fmt/format.h>

#include <random>

#include "fp4serve/error.h"

namespace fp4serve::server {
namespace {

using nlohmann::json;
using Choice = ToolRequest::Choice;

// vLLM's tool call id form.
std::string call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("chatcmpl-tool-{:016x}{:016x}", rng(), rng());
}

}  // namespace

void merge_delta(json& into, const json& more) {
  for (const auto& [key, value] : more.items()) {
    if (key == "tool_calls") {
      if (!into.contains(key)) into[key] = json::array();
      for (const auto& c : value) {
        json& calls = into[key];
        if (!c.contains("id") && !calls.empty() && calls.back().value("index", -1) == c.value("index", -2)) {
          json& fn = calls.back()["function"];
          fn["arguments"] = fn.value("arguments", std::string()) + c["function"]["arguments"].get<std::string>();
        } else {
          calls.push_back(c);
        }
      }
    } else {
      into[key] = into.value(key, std::string()) + value.get<std::string>();
    }
  }
}

ChoiceParser::ChoiceParser(const ApiRequest& api, const ServeLimits& limits, CallOutput calls) : mode_(calls) {
  if (api.endpoint != Endpoint::kChatCompletions) return;
  reasoning_ = limits.reasoning_parser.has_value();
  std::optional<ToolParser> tools;
  if (api.tools) {
    choice_ = api.tools->choice;
    function_ = api.tools->function;
    parallel_ = api.tools->parallel;
    if (choice_ == Choice::kAuto) tools = limits.tool_parser;
  }
  const bool forced = choice_ == Choice::kRequired || choice_ == Choice::kNamed;
  active_ = reasoning_ || tools.has_value() || forced;
  if (!active_) return;
  if (!forced) parser_.emplace(tools, limits.reasoning_parser, mode_);
  if (forced && mode_ == CallOutput::kStreamed) {
    forced_stream_.emplace(choice_ == Choice::kNamed ? std::optional(function_) : std::nullopt);
  }
  keep_special_ = (tools && needs_special_tokens(*tools)) ||
                  (limits.reasoning_parser && needs_special_tokens(*limits.reasoning_parser));
}

json ChoiceParser::tool_call_json(const ToolCall& call, std::optional<int> index) const {
  json j = {{"id", call_id()}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
  if (index) j["index"] = *index;
  return j;
}

void ChoiceParser::add_deltas(json& calls, const std::vector<ToolCallDelta>& deltas) {
  for (const auto& d : deltas) {
    if (!parallel_ && d.index >= 1) continue;  // parallel_tool_calls false: the first call only
    json entry;
    if (!d.name.empty()) {  // a call's first piece
      ++calls_;
      entry = tool_call_json({d.name, d.arguments}, d.index);
    } else {
      entry = {{"index", d.index}, {"function", {{"arguments", d.arguments}}}};
    }
    merge_delta(calls, json{{"tool_calls", json::array({entry})}});
  }
}

json ChoiceParser::to_delta(ParsedOutput out) {
  json d = json::object();
  if (!out.reasoning.empty()) d["reasoning_content"] = out.reasoning;
  if (!out.content.empty()) d["content"] = out.content;
  json calls = json::array();
  for (const auto& c : out.calls) {
    if (!parallel_ && calls_ >= 1) break;  // parallel_tool_calls false: the first call only
    calls.push_back(tool_call_json(c, calls_++));
  }
  json streamed = json::object();
  add_deltas(streamed, out.deltas);
  if (streamed.contains("tool_calls")) {
    for (auto& c : streamed["tool_calls"]) calls.push_back(std::move(c));
  }
  if (!calls.empty()) d["tool_calls"] = calls;
  return d;
}

json ChoiceParser::delta(std::string_view text) {
  if (parser_) return to_delta(parser_->push(text));
  forced_text_ += text;
  if (forced_stream_) {
    ParsedOutput out;
    out.deltas = forced_stream_->push(text);
    return to_delta(std::move(out));
  }
  return json::object();
}

json ChoiceParser::finish_delta() {
  if (parser_) return to_delta(parser_->finish());
  ParsedOutput out;
  if (forced_stream_) {  // what was streamed stays: the calls as far as the model wrote them
    out.deltas = forced_stream_->finish();
    return to_delta(std::move(out));
  }
  try {
    out.calls = forced_tool_calls(forced_text_, choice_ == Choice::kNamed ? std::optional(function_) : std::nullopt);
  } catch (const UsageError&) {
    out.content = forced_text_;  // cut short (max_tokens): what the model wrote
  }
  return to_delta(std::move(out));
}

json ChoiceParser::message(const std::string& text) {
  json d = delta(text);
  merge_delta(d, finish_delta());
  json msg = {{"role", "assistant"}, {"content", d.value("content", std::string())}};
  if (d.contains("tool_calls")) {
    for (auto& c : d["tool_calls"]) c.erase("index");  // a whole message's calls carry no stream index
    msg["tool_calls"] = d["tool_calls"];
    if (msg["content"] == "") msg["content"] = nullptr;
  }
  if (reasoning_) msg["reasoning_content"] = d.contains("reasoning_content") ? d["reasoning_content"] : json(nullptr);
  return msg;
}

std::string ChoiceParser::finish_reason(const std::string& reason) const {
  // OpenAI: a forced named function ends with "stop"; calls chosen by the model (auto, required) "tool_calls".
  if (calls_ > 0 && reason == "stop" && choice_ != Choice::kNamed) return "tool_calls";
  return reason;
}

}  // namespace fp4serve::server
