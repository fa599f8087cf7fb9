// SPDX-License-Identifier: Apache-2.0
#include "server/tool_call_scan.h"

#include <fmt/format.h>

#include <algorithm>

#include "fp4serve/error.h"
#include "runtime/structured_output.h"

namespace fp4serve::server {
namespace scan {

using nlohmann::json;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// End (one past) of the JSON value starting at s[start] ('{' or '['); npos when it does not end within s.
size_t json_value_end(std::string_view s, size_t start) { return runtime::json_container_end(s, start); }

// End (one past) of the JSON string starting at s[start] ('"'); npos when it does not end within s.
size_t json_string_end(std::string_view s, size_t start) {
  for (size_t i = start + 1; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '"') {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// End of any JSON value starting at s[start]: object / array / string as above, a scalar at the next ',', '}',
// ']' or space; npos when it may continue past s.
size_t any_value_end(std::string_view s, size_t start) {
  const char c = s[start];
  if (c == '{' || c == '[') return json_value_end(s, start);
  if (c == '"') return json_string_end(s, start);
  for (size_t i = start; i < s.size(); ++i) {
    if (s[i] == ',' || s[i] == '}' || s[i] == ']' || is_space(s[i])) return i;
  }
  return std::string_view::npos;
}

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

// The call object at s[at] == '{': {"name": …, "arguments" | "parameters": …, …}, keys in any order.
CallSpan scan_call_object(std::string_view s, size_t at) {
  CallSpan span;
  span.end = s.size();
  size_t i = at + 1;
  for (;;) {
    i = skip_space(s, i);
    if (i >= s.size()) return span;
    if (s[i] == '}') {
      span.complete = true;
      span.end = i + 1;
      return span;
    }
    if (s[i] == ',') {
      ++i;
      continue;
    }
    if (s[i] != '"') return span;  // not a call object: never completes
    const size_t key_end = json_string_end(s, i);
    if (key_end == std::string_view::npos) return span;
    const std::string_view key = s.substr(i + 1, key_end - i - 2);
    i = skip_space(s, key_end);
    if (i >= s.size()) return span;
    if (s[i] != ':') return span;
    i = skip_space(s, i + 1);
    if (i >= s.size()) return span;
    const bool args = key == "arguments" || key == "parameters";
    if (args && span.args_begin == std::string_view::npos) {
      span.args_begin = i;
      span.args_string = s[i] == '"';
    }
    const size_t end = any_value_end(s, i);
    if (end == std::string_view::npos) return span;
    if (key == "name" && s[i] == '"') {
      const json name = json::parse(s.substr(i, end - i), nullptr, false);
      if (name.is_string()) span.name = name.get<std::string>();
    }
    if (args && span.args_end == std::string_view::npos) span.args_end = end;
    i = end;
  }
}

// The call objects of a body: one, or several in an array or separated by ',' / ';' (llama3_json), after an
// optional <|python_tag|>. Stops at anything else.
std::vector<CallSpan> scan_call_objects(std::string_view s) {
  std::vector<CallSpan> out;
  size_t i = skip_space(s, 0);
  constexpr std::string_view kTag = "<|python_tag|>";
  if (s.substr(i, kTag.size()) == kTag) i += kTag.size();
  for (;;) {
    while (i < s.size() && (is_space(s[i]) || s[i] == '[' || s[i] == ',' || s[i] == ';')) ++i;
    if (i >= s.size() || s[i] != '{') return out;
    out.push_back(scan_call_object(s, i));
    if (!out.back().complete) return out;
    i = out.back().end;
  }
}

// Mistral v11: name[ARGS]{…}, several joined by [TOOL_CALLS] (a name may carry [CALL_ID]…).
std::vector<CallSpan> scan_mistral_v11(std::string_view s) {
  std::vector<CallSpan> out;
  size_t i = 0;
  for (;;) {
    i = skip_space(s, i);
    if (s.substr(i, 12) == "[TOOL_CALLS]") i = skip_space(s, i + 12);
    if (i >= s.size()) return out;
    const size_t args = s.find("[ARGS]", i);
    CallSpan span;
    span.end = s.size();
    if (args == std::string_view::npos) return out;  // the name is still being written
    std::string_view name = trim(s.substr(i, args - i));
    if (const size_t id = name.find("[CALL_ID]"); id != std::string_view::npos) name = trim(name.substr(0, id));
    span.name = std::string(name);
    const size_t v = skip_space(s, args + 6);
    if (v < s.size()) {
      span.args_begin = v;
      span.args_end = s[v] == '{' ? json_value_end(s, v) : std::string_view::npos;
      if (span.args_end != std::string_view::npos) {
        span.complete = true;
        span.end = span.args_end;
      }
    }
    out.push_back(span);
    if (!span.complete) return out;
    i = span.end;
  }
}

// The arguments text of a complete call as both parsers give it: the value's JSON text; the string's contents
// when the model wrote the arguments as a JSON string; "{}" when it wrote none (or null).
std::string arguments_text(std::string_view s, const CallSpan& span) {
  if (span.args_begin == std::string_view::npos || span.args_end == std::string_view::npos) return "{}";
  const std::string_view raw = s.substr(span.args_begin, span.args_end - span.args_begin);
  if (raw == "null") return "{}";
  if (span.args_string) {
    const json text = json::parse(raw, nullptr, false);
    return text.is_string() ? std::string(trim(text.get<std::string>())) : std::string(raw);
  }
  return std::string(raw);
}

// {"name": string, "arguments" | "parameters": a JSON value (an object, or its JSON text)} → a call; nullopt
// without a string name.
std::optional<ToolCall> call_of(const json& obj) {
  if (!obj.is_object()) return std::nullopt;
  const auto name = obj.find("name");
  if (name == obj.end() || !name->is_string()) return std::nullopt;
  auto args = obj.find("arguments");
  if (args == obj.end()) args = obj.find("parameters");
  if (args == obj.end() || args->is_null()) return ToolCall{name->get<std::string>(), "{}"};
  if (args->is_object()) return ToolCall{name->get<std::string>(), args->dump()};
  if (args->is_string()) {
    const json parsed = json::parse(args->get<std::string>(), nullptr, false);
    if (parsed.is_object()) return ToolCall{name->get<std::string>(), parsed.dump()};
  }
  // Any other value (an array, a number, a string that is not an object's JSON) is the arguments as written, as
  // vLLM's parsers pass them on, and as a stream sends them once the name is out (it cannot take a call back).
  return ToolCall{name->get<std::string>(), args->dump()};
}

}  // namespace scan

using nlohmann::json;

std::vector<ToolCall> forced_tool_calls(const std::string& text, const std::optional<std::string>& named_function) {
  const json v = json::parse(text, nullptr, false);
  if (named_function) {
    if (!v.is_object()) throw UsageError("the forced tool call's arguments are not a complete JSON object");
    return {{*named_function, std::string(scan::trim(text))}};
  }
  if (!v.is_array() || v.empty()) throw UsageError("the required tool calls are not a complete JSON array");
  std::vector<ToolCall> out;
  for (const auto& item : v) {
    auto call = scan::call_of(item);
    if (!call) throw UsageError("a required tool call is not {\"name\", \"parameters\"}");
    out.push_back(std::move(*call));
  }
  const std::vector<scan::CallSpan> spans = scan::scan_call_objects(text);
  if (spans.size() == out.size()) {
    for (size_t i = 0; i < spans.size(); ++i) out[i].arguments = scan::arguments_text(text, spans[i]);
  }
  return out;
}

ForcedCallStream::ForcedCallStream(std::optional<std::string> named_function) : named_(std::move(named_function)) {}

std::vector<ToolCallDelta> ForcedCallStream::push(std::string_view text) {
  std::vector<ToolCallDelta> out;
  if (named_) {
    if (started_ == 0) {
      out.push_back({0, *named_, ""});
      started_ = 1;
    }
    if (text_.empty()) text.remove_prefix(scan::skip_space(text, 0));  // leading whitespace is not the arguments'
    if (text.empty()) return out;
    text_ += text;
    size_t keep = text.size();
    while (keep > 0 && scan::is_space(text[keep - 1])) --keep;
    if (keep > 0) {
      out.push_back({0, "", held_space_ + std::string(text.substr(0, keep))});
      held_space_.assign(text.substr(keep));
    } else {
      held_space_.append(text);
    }
    return out;
  }
  text_ += text;
  const std::vector<scan::CallSpan> spans = scan::scan_call_objects(text_);
  for (size_t k = 0; k < spans.size(); ++k) {
    const scan::CallSpan& sp = spans[k];
    if (k >= sent_.size()) {
      if (!sp.name) break;
      out.push_back({started_++, *sp.name, ""});
      sent_.push_back(0);
    }
    if (sp.args_begin == std::string_view::npos || text_[sp.args_begin] != '{') {
      if (sp.complete && sent_[k] != std::string::npos) {
        out.push_back({static_cast<int>(k), "", scan::arguments_text(text_, sp)});
        sent_[k] = std::string::npos;
      }
      continue;
    }
    if (sent_[k] == std::string::npos) continue;
    const size_t end = sp.args_end != std::string_view::npos ? sp.args_end : text_.size();
    const size_t from = std::max(sent_[k], sp.args_begin);
    if (end > from) out.push_back({static_cast<int>(k), "", text_.substr(from, end - from)});
    sent_[k] = sp.args_end != std::string_view::npos ? std::string::npos : std::max(sent_[k], end);
  }
  return out;
}

std::vector<ToolCallDelta> ForcedCallStream::finish() {
  std::vector<ToolCallDelta> out = push("");
  held_space_.clear();
  return out;
}

}  // namespace fp4serve::server
