// SPDX-License-Identifier: Apache-2.0
#include "server/tool_calls.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>

#include "fp4serve/error.h"
#include "server/tool_call_scan.h"

namespace fp4serve::server {
namespace {

using nlohmann::json;
using namespace scan;

// Length of the longest suffix of `s` that is a proper prefix of `marker` (text that may still become it).
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

// One object or an array of objects, each a call; nullopt when any is not.
std::optional<std::vector<ToolCall>> calls_of(std::string_view text) {
  const json v = json::parse(trim(text), nullptr, false);
  if (v.is_discarded()) return std::nullopt;
  std::vector<ToolCall> out;
  for (const auto& item : v.is_array() ? v : json::array({v})) {
    auto call = call_of(item);
    if (!call) return std::nullopt;
    out.push_back(std::move(*call));
  }
  if (out.empty()) return std::nullopt;
  return out;
}

// Llama 3: objects separated by ';' (vLLM's llama3_json), after an optional <|python_tag|>.
std::optional<std::vector<ToolCall>> llama3_calls(std::string_view text) {
  text = trim(text);
  constexpr std::string_view kTag = "<|python_tag|>";
  if (text.substr(0, kTag.size()) == kTag) text = trim(text.substr(kTag.size()));
  std::vector<ToolCall> out;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] != '{') return std::nullopt;
    const size_t end = json_value_end(text, i);
    if (end == std::string_view::npos) return std::nullopt;
    auto call = call_of(json::parse(text.substr(i, end - i), nullptr, false));
    if (!call) return std::nullopt;
    out.push_back(std::move(*call));
    i = end;
    while (i < text.size() && (is_space(text[i]) || text[i] == ';')) ++i;
  }
  if (out.empty()) return std::nullopt;
  return out;
}

// Mistral after [TOOL_CALLS]: a JSON array, or name[ARGS]{…} (several joined by [TOOL_CALLS]).
std::optional<std::vector<ToolCall>> mistral_calls(std::string_view body) {
  body = trim(body);
  if (!body.empty() && (body.front() == '[' || body.front() == '{')) return calls_of(body);
  std::vector<ToolCall> out;
  size_t from = 0;
  while (from < body.size()) {
    const size_t next = body.find("[TOOL_CALLS]", from);
    const std::string_view part = trim(body.substr(from, next == std::string_view::npos ? next : next - from));
    from = next == std::string_view::npos ? body.size() : next + 12;
    if (part.empty()) continue;
    const size_t args = part.find("[ARGS]");
    if (args == std::string_view::npos) return std::nullopt;
    std::string_view name = trim(part.substr(0, args));
    if (const size_t id = name.find("[CALL_ID]"); id != std::string_view::npos) name = trim(name.substr(0, id));
    const json a = json::parse(trim(part.substr(args + 6)), nullptr, false);
    if (name.empty() || !a.is_object()) return std::nullopt;
    out.push_back({std::string(name), a.dump()});
  }
  if (out.empty()) return std::nullopt;
  return out;
}

struct Markers {
  std::string_view start;  // empty: llama3_json (decided by the first character)
  std::string_view end;    // empty: the call runs to the end of the output
};

Markers markers_of(ToolParser p) {
  switch (p) {
    case ToolParser::kHermes: return {"<tool_call>", "</tool_call>"};
    case ToolParser::kLlama3Json: return {"", ""};
    case ToolParser::kMistral: return {"[TOOL_CALLS]", ""};
    case ToolParser::kGranite: return {"<|tool_call|>", ""};
    case ToolParser::kOpenAi: return {"", ""};
  }
  return {"", ""};
}

}  // namespace

ParsedOutput& ParsedOutput::operator+=(ParsedOutput other) {
  content += other.content;
  reasoning += other.reasoning;
  for (auto& c : other.calls) calls.push_back(std::move(c));
  for (auto& d : other.deltas) deltas.push_back(std::move(d));
  return *this;
}

std::vector<ToolCall> assemble_calls(const std::vector<ToolCallDelta>& deltas) {
  std::vector<ToolCall> calls;
  for (const auto& d : deltas) {
    if (d.index < 0) continue;
    if (static_cast<size_t>(d.index) >= calls.size()) calls.resize(static_cast<size_t>(d.index) + 1);
    if (!d.name.empty()) calls[static_cast<size_t>(d.index)].name = d.name;
    calls[static_cast<size_t>(d.index)].arguments += d.arguments;
  }
  return calls;
}

std::optional<ToolParser> tool_parser_from_name(std::string_view name) {
  for (const ToolParser p : {ToolParser::kHermes, ToolParser::kLlama3Json, ToolParser::kMistral, ToolParser::kGranite,
                             ToolParser::kOpenAi}) {
    if (name == tool_parser_name(p)) return p;
  }
  return std::nullopt;
}

const char* tool_parser_name(ToolParser parser) {
  switch (parser) {
    case ToolParser::kHermes: return "hermes";
    case ToolParser::kLlama3Json: return "llama3_json";
    case ToolParser::kMistral: return "mistral";
    case ToolParser::kGranite: return "granite";
    case ToolParser::kOpenAi: return "openai";
  }
  return "?";
}

std::optional<ReasoningParser> reasoning_parser_from_name(std::string_view name) {
  if (name == "qwen3") return ReasoningParser::kQwen3;
  if (name == "deepseek_r1") return ReasoningParser::kDeepSeekR1;
  if (name == "openai_gptoss" || name == "gpt_oss") return ReasoningParser::kGptOss;
  return std::nullopt;
}

const char* reasoning_parser_name(ReasoningParser parser) {
  switch (parser) {
    case ReasoningParser::kQwen3: return "qwen3";
    case ReasoningParser::kDeepSeekR1: return "deepseek_r1";
    case ReasoningParser::kGptOss: return "openai_gptoss";
  }
  return "?";
}

std::optional<ToolParser> detect_tool_parser(std::string_view architecture, std::string_view chat_template) {
  if (architecture == "GptOssForCausalLM" || chat_template.find("<|channel|>") != std::string_view::npos) {
    return ToolParser::kOpenAi;
  }
  if (chat_template.find("<tool_call>") != std::string_view::npos) return ToolParser::kHermes;
  if (chat_template.find("[TOOL_CALLS]") != std::string_view::npos) return ToolParser::kMistral;
  if (chat_template.find("<|tool_call|>") != std::string_view::npos) return ToolParser::kGranite;
  if (chat_template.find("<|python_tag|>") != std::string_view::npos ||
      (architecture == "LlamaForCausalLM" && chat_template.find("tools") != std::string_view::npos &&
       chat_template.find("\"parameters\"") != std::string_view::npos)) {
    return ToolParser::kLlama3Json;
  }
  return std::nullopt;
}

bool needs_special_tokens(ToolParser parser) {
  return parser == ToolParser::kMistral || parser == ToolParser::kGranite || parser == ToolParser::kOpenAi;
}
bool needs_special_tokens(ReasoningParser parser) { return parser == ReasoningParser::kGptOss; }

// The parser's state. Stages: the reasoning prefix (qwen3), then content with tool calls; GPT-OSS's harmony
// messages are their own stage (channels carry reasoning, content and calls).
struct OutputParser::State {
  std::optional<ToolParser> tools;
  std::optional<ReasoningParser> reasoning;
  CallOutput mode = CallOutput::kWhole;
  bool harmony = false;
  // Streamed calls: the next call's index; the calls of the body being written (their index, the bytes of
  // their arguments sent so far, whether all were); a harmony call's state.
  struct BodyCall {
    int index = 0;
    size_t sent = 0;
    bool finished = false;
  };
  int next_index = 0;
  std::vector<BodyCall> body_calls;
  bool harmony_call_started = false;
  bool harmony_leading = true;
  std::string harmony_space;  // a streamed harmony call's trailing whitespace, held
  std::string buffer;  // text received but not yet turned into output

  // qwen3 reasoning: 0 undecided (text so far is whitespace + a prefix of <think>), 1 thinking, 2 done.
  int think = 0;
  // tool stage: in a call (after its start marker); llama3_json: 0 undecided, 1 calls, 2 content.
  bool in_call = false;
  int llama = 0;
  bool any_call = false;
  std::string pending_space;  // trailing whitespace of the content, held while a call may follow
  // harmony: in a message body; its channel and recipient.
  bool in_body = false;
  std::string channel, recipient;

  void content(ParsedOutput& out, std::string_view text) {
    if (!tools) {
      out.content += text;
      return;
    }
    size_t keep = text.size();
    while (keep > 0 && is_space(text[keep - 1])) --keep;
    if (keep > 0) {
      out.content += pending_space;
      pending_space.clear();
      out.content += text.substr(0, keep);
    }
    pending_space += text.substr(keep);
  }

  std::vector<CallSpan> spans_of(std::string_view body) const {
    if (*tools == ToolParser::kMistral) {
      const std::string_view t = trim(body);
      if (t.empty() || (t.front() != '[' && t.front() != '{')) return scan_mistral_v11(body);
    }
    return scan_call_objects(body);
  }

  void call_body(ParsedOutput& out, std::string_view body, std::string_view raw) {
    std::optional<std::vector<ToolCall>> calls;
    switch (*tools) {
      case ToolParser::kHermes:
      case ToolParser::kGranite: calls = calls_of(body); break;
      case ToolParser::kMistral: calls = mistral_calls(body); break;
      case ToolParser::kLlama3Json: calls = llama3_calls(body); break;
      case ToolParser::kOpenAi: break;
    }
    if (!calls) {  // not the family's JSON: the model's text stays content
      content(out, raw);
      return;
    }
    // The arguments as the model wrote them (what streaming sends), where the scan finds every call.
    const std::vector<CallSpan> spans = spans_of(body);
    if (spans.size() == calls->size() && std::ranges::all_of(spans, [](const CallSpan& c) { return c.complete; })) {
      for (size_t i = 0; i < spans.size(); ++i) (*calls)[i].arguments = arguments_text(body, spans[i]);
    }
    pending_space.clear();
    any_call = true;
    for (auto& c : *calls) {
      if (mode == CallOutput::kStreamed) {
        out.deltas.push_back({next_index++, std::move(c.name), std::move(c.arguments)});
      } else {
        out.calls.push_back(std::move(c));
      }
    }
  }

  // Streaming: sends what `body` (a call body so far; `done`: complete) adds to its calls: a call's first piece
  // once its name is written, then the arguments' bytes (an object as it is written; anything else whole).
  void stream_body(ParsedOutput& out, std::string_view body, bool done) {
    const std::vector<CallSpan> spans = spans_of(body);
    for (size_t k = 0; k < spans.size(); ++k) {
      const CallSpan& sp = spans[k];
      if (k >= body_calls.size()) {
        if (!sp.name) return;
        body_calls.push_back({next_index++, 0, false});
        out.deltas.push_back({body_calls.back().index, *sp.name, ""});
        pending_space.clear();
        any_call = true;
      }
      BodyCall& call = body_calls[k];
      if (call.finished) continue;
      const bool ended = sp.complete || done;
      if (sp.args_begin != std::string_view::npos && body[sp.args_begin] == '{') {
        const size_t end = sp.args_end != std::string_view::npos ? sp.args_end : body.size();
        const size_t from = std::max(call.sent, sp.args_begin);
        if (end > from) out.deltas.push_back({call.index, "", std::string(body.substr(from, end - from))});
        call.sent = std::max(call.sent, end);
        call.finished = sp.args_end != std::string_view::npos;
      } else if (ended && (sp.args_begin == std::string_view::npos || sp.args_end != std::string_view::npos)) {
        out.deltas.push_back({call.index, "", arguments_text(body, sp)});  // a string, null or none: whole
        call.finished = true;
      }
    }
  }

  // A call body is complete: whole, or the rest of what streaming sent (a body that never showed a name is
  // parsed whole: its calls, or content).
  void end_body(ParsedOutput& out, std::string_view body, std::string_view raw) {
    if (mode == CallOutput::kStreamed && !body_calls.empty()) {
      stream_body(out, body, true);
    } else {
      call_body(out, body, raw);
    }
    body_calls.clear();
  }

  // The tool stage over `buffer`; `final`: the output has ended.
  void tool_stage(ParsedOutput& out, bool final) {
    if (!tools) {
      out.content += buffer;
      buffer.clear();
      return;
    }
    const Markers m = markers_of(*tools);
    if (*tools == ToolParser::kLlama3Json) {
      if (llama == 0) {
        const std::string_view t = trim(buffer);
        constexpr std::string_view kTag = "<|python_tag|>";
        if (t.empty() || (t.size() < kTag.size() && kTag.substr(0, t.size()) == t)) {
          if (!final) return;
        }
        llama = (!t.empty() && (t.front() == '{' || t.substr(0, kTag.size()) == kTag)) ? 1 : 2;
      }
      if (llama == 2) {
        content(out, buffer);
        buffer.clear();
      } else if (final) {
        end_body(out, buffer, buffer);
        buffer.clear();
      } else if (mode == CallOutput::kStreamed) {
        stream_body(out, buffer, false);
      }
      return;
    }
    for (;;) {
      if (!in_call) {
        const size_t at = buffer.find(m.start);
        if (at == std::string::npos) {
          const size_t hold = final ? 0 : partial_suffix(buffer, m.start);
          content(out, std::string_view(buffer).substr(0, buffer.size() - hold));
          buffer.erase(0, buffer.size() - hold);
          return;
        }
        content(out, std::string_view(buffer).substr(0, at));
        buffer.erase(0, at + m.start.size());
        in_call = true;
      }
      if (m.end.empty()) {  // the call runs to the end of the output
        if (final) {
          end_body(out, buffer, std::string(m.start) + buffer);
          buffer.clear();
        } else if (mode == CallOutput::kStreamed) {
          stream_body(out, buffer, false);
        }
        return;
      }
      const size_t end = buffer.find(m.end);
      if (end == std::string::npos) {
        if (final) {  // never closed: what the model wrote
          end_body(out, buffer, std::string(m.start) + buffer);
          buffer.clear();
        } else if (mode == CallOutput::kStreamed) {
          // Text that may be the start of the end marker is not part of the call.
          stream_body(out, std::string_view(buffer).substr(0, buffer.size() - partial_suffix(buffer, m.end)), false);
        }
        return;
      }
      end_body(out, std::string_view(buffer).substr(0, end), std::string(m.start) + buffer.substr(0, end + m.end.size()));
      buffer.erase(0, end + m.end.size());
      in_call = false;
    }
  }

  // qwen3: <think>…</think> at the start is reasoning; the whitespace after </think> belongs to neither part.
  void think_stage(ParsedOutput& out, bool final) {
    constexpr std::string_view kOpen = "<think>", kClose = "</think>";
    if (think == 0) {
      const std::string_view t = trim(buffer);
      if (t.size() < kOpen.size() && kOpen.substr(0, t.size()) == t && !final) return;
      if (t.substr(0, kOpen.size()) == kOpen) {
        buffer.erase(0, buffer.find(kOpen) + kOpen.size());
        think = 1;
      } else {
        think = reasoning == ReasoningParser::kDeepSeekR1 ? 1 : 2;  // deepseek_r1: the prompt opened the block
      }
    }
    if (think == 1) {
      const size_t close = buffer.find(kClose);
      if (close == std::string::npos) {
        const size_t hold = final ? 0 : partial_suffix(buffer, kClose);
        out.reasoning += buffer.substr(0, buffer.size() - hold);
        buffer.erase(0, buffer.size() - hold);
        if (!final) return;
        think = 2;
      } else {
        out.reasoning += buffer.substr(0, close);
        buffer.erase(0, close + kClose.size());
        think = 3;
      }
    }
    if (think == 3) {
      size_t skip = 0;
      while (skip < buffer.size() && is_space(buffer[skip])) ++skip;
      buffer.erase(0, skip);
      if (buffer.empty() && !final) return;
      think = 2;
    }
    tool_stage(out, final);
  }

  // Harmony: [<|start|>assistant]<|channel|>NAME[ to=functions.F][ <|constrain|>json]<|message|>BODY<|end|>|<|call|>|<|return|>.
  void harmony_stage(ParsedOutput& out, bool final) {
    static constexpr std::array<std::string_view, 3> kEnds = {"<|end|>", "<|call|>", "<|return|>"};
    for (;;) {
      if (!in_body) {
        const size_t msg = buffer.find("<|message|>");
        if (msg == std::string::npos) {
          if (final) {
            // No harmony header at all: plain text.
            const std::string_view t = trim(buffer);
            if (!t.empty() && t.find("<|channel|>") == std::string_view::npos) out.content += t;
            buffer.clear();
          }
          return;
        }
        const std::string header = buffer.substr(0, msg);
        buffer.erase(0, msg + 11);
        channel.clear();
        recipient.clear();
        if (const size_t c = header.find("<|channel|>"); c != std::string::npos) {
          const size_t from = c + 11;
          size_t to = from;
          while (to < header.size() && !is_space(header[to]) && header[to] != '<') ++to;
          channel = header.substr(from, to - from);
        }
        if (const size_t r = header.find("to="); r != std::string::npos) {
          size_t to = r + 3;
          while (to < header.size() && !is_space(header[to]) && header[to] != '<') ++to;
          recipient = header.substr(r + 3, to - r - 3);
        }
        in_body = true;
      }
      size_t end = std::string::npos, end_len = 0;
      for (const auto e : kEnds) {
        const size_t at = buffer.find(e);
        if (at < end) {
          end = at;
          end_len = e.size();
        }
      }
      const bool is_call = channel == "commentary" && recipient.rfind("functions.", 0) == 0;
      if (end == std::string::npos && !final) {
        if (is_call && mode == CallOutput::kStreamed) {
          size_t hold = 0;
          for (const auto e : kEnds) hold = std::max(hold, partial_suffix(buffer, e));
          stream_harmony_call(out, std::string_view(buffer).substr(0, buffer.size() - hold), false);
          buffer.erase(0, buffer.size() - hold);
          return;
        }
        if (is_call) return;  // a call is returned whole
        size_t hold = 0;
        for (const auto e : kEnds) hold = std::max(hold, partial_suffix(buffer, e));
        hold = std::max(hold, partial_suffix(buffer, "<|start|>"));
        emit_body(out, std::string_view(buffer).substr(0, buffer.size() - hold));
        buffer.erase(0, buffer.size() - hold);
        return;
      }
      const std::string body = buffer.substr(0, end == std::string::npos ? buffer.size() : end);
      buffer.erase(0, end == std::string::npos ? buffer.size() : end + end_len);
      if (is_call && harmony_call_started) {
        stream_harmony_call(out, body, true);
      } else if (is_call) {
        // Any JSON value is the arguments, as a stream sends it (stream_harmony_call); text that is not JSON is
        // content here, where a stream has already sent it as a call's arguments.
        const json args = json::parse(trim(body), nullptr, false);
        if (!args.is_discarded()) {
          ToolCall call{recipient.substr(10), std::string(trim(body))};
          if (mode == CallOutput::kStreamed) {
            out.deltas.push_back({next_index++, std::move(call.name), std::move(call.arguments)});
          } else {
            out.calls.push_back(std::move(call));
          }
          any_call = true;
        } else {
          out.content += body;
        }
      } else {
        emit_body(out, body);
      }
      in_body = false;
      if (const size_t start = buffer.find("<|start|>"); start != std::string::npos) buffer.erase(0, start + 9);
      if (end == std::string::npos) return;
    }
  }

  // Streaming a harmony call: its first piece (the recipient's name) at once, then the body as the arguments,
  // without leading and (until more follows) trailing whitespace. `text` is consumed; `done`: the body ended.
  void stream_harmony_call(ParsedOutput& out, std::string_view text, bool done) {
    if (!harmony_call_started) {
      out.deltas.push_back({next_index++, recipient.substr(10), ""});
      harmony_call_started = true;
      harmony_leading = true;
      any_call = true;
    }
    if (harmony_leading) {
      const size_t first = skip_space(text, 0);
      text.remove_prefix(first);
      if (!text.empty()) harmony_leading = false;
    }
    // Trailing whitespace waits: sent when more of the body follows, dropped at its end.
    size_t keep = text.size();
    while (keep > 0 && is_space(text[keep - 1])) --keep;
    if (keep > 0) {
      out.deltas.push_back({next_index - 1, "", harmony_space + std::string(text.substr(0, keep))});
      harmony_space.assign(text.substr(keep));
    } else {
      harmony_space.append(text);
    }
    if (done) {
      harmony_space.clear();
      harmony_call_started = false;
    }
  }

  void emit_body(ParsedOutput& out, std::string_view text) {
    if (channel == "analysis") {
      out.reasoning += text;
    } else {
      out.content += text;  // final, or commentary without a recipient (a preamble)
    }
  }

  ParsedOutput run(bool final) {
    ParsedOutput out;
    if (harmony) {
      harmony_stage(out, final);
    } else if (reasoning == ReasoningParser::kQwen3 || reasoning == ReasoningParser::kDeepSeekR1) {
      think_stage(out, final);
    } else {
      tool_stage(out, final);
    }
    if (final && !any_call) {
      out.content += pending_space;
      pending_space.clear();
    }
    return out;
  }
};

OutputParser::OutputParser(std::optional<ToolParser> tools, std::optional<ReasoningParser> reasoning, CallOutput calls)
    : state_(std::make_unique<State>()) {
  state_->mode = calls;
  state_->harmony = tools == ToolParser::kOpenAi || reasoning == ReasoningParser::kGptOss;
  state_->tools = tools;
  state_->reasoning = reasoning;
}
OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;

ParsedOutput OutputParser::push(std::string_view text) {
  state_->buffer += text;
  return state_->run(false);
}

ParsedOutput OutputParser::finish() { return state_->run(true); }

}  // namespace fp4serve::server
