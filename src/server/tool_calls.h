// SPDX-License-Identifier: Apache-2.0
// Tool calls and reasoning in a model's output, by model family, with vLLM's parser names
// (--tool-call-parser, --reasoning-parser). Each family writes calls its own way:
//  - hermes (Qwen2.5, Qwen3, Hermes): <tool_call>{"name": …, "arguments": {…}}</tool_call>, repeated;
//  - llama3_json (Llama 3.x): the whole output is {"name": …, "parameters": {…}} (after an optional
//    <|python_tag|>), several separated by ';';
//  - mistral: [TOOL_CALLS][{"name": …, "arguments": {…}}, …], or [TOOL_CALLS]name[ARGS]{…} (tokenizer v11+);
//  - granite (Granite 3.x): <|tool_call|>[{"name": …, "arguments": {…}}, …];
//  - openai (GPT-OSS, harmony): messages <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}
//    end with <|call|>; analysis is reasoning, final is content.
// Reasoning parsers: qwen3 (<think>…</think> at the start), deepseek_r1 (everything before </think>, the prompt
// having opened the block), openai_gptoss (harmony's analysis channel).
// The parsers are incremental, for streaming: text goes in as it is generated, and what comes out is final
// (content never includes a prefix of a marker that may still complete; a call is returned once whole), so the
// concatenation of every push() and finish() is the same however the text was split.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fp4serve::server {

enum class ToolParser { kHermes, kLlama3Json, kMistral, kGranite, kOpenAi };
enum class ReasoningParser { kQwen3, kDeepSeekR1, kGptOss };

/// vLLM's names: "hermes", "llama3_json", "mistral", "granite", "openai"; nullopt for another name.
std::optional<ToolParser> tool_parser_from_name(std::string_view name);
const char* tool_parser_name(ToolParser parser);
/// "qwen3" (a reply that opens with <think> reasons until </think>), "deepseek_r1" (the reply reasons from its
/// start until </think>, <think> optional: templates that open the block in the prompt), "openai_gptoss";
/// nullopt for another name.
std::optional<ReasoningParser> reasoning_parser_from_name(std::string_view name);
const char* reasoning_parser_name(ReasoningParser parser);

/// The parser a model calls for, from its architecture (config.json "architectures"[0]) and chat template text:
/// GPT-OSS → openai; a template that writes <tool_call> → hermes, [TOOL_CALLS] → mistral, <|tool_call|> →
/// granite, <|python_tag|> or a Llama architecture whose template renders tools → llama3_json. nullopt: none.
std::optional<ToolParser> detect_tool_parser(std::string_view architecture, std::string_view chat_template);

/// Whether the parser's markers may be special tokens the detokenizer must keep ([TOOL_CALLS], <|tool_call|>,
/// harmony's).
bool needs_special_tokens(ToolParser parser);
bool needs_special_tokens(ReasoningParser parser);

struct ToolCall {
  std::string name;
  std::string arguments;  ///< JSON text of an object
};

/// What a piece of output became.
struct ParsedOutput {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> calls;
  ParsedOutput& operator+=(ParsedOutput other);
};

/// Splits a model's output into content, reasoning and tool calls, incrementally. `tools`: nullopt parses no
/// calls (tool_choice none, or no tools); `reasoning`: nullopt parses no reasoning. A call whose body is not the
/// JSON the family writes stays in the content as the model wrote it (as vLLM returns it).
class OutputParser {
 public:
  OutputParser(std::optional<ToolParser> tools, std::optional<ReasoningParser> reasoning);
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;

  ParsedOutput push(std::string_view text);
  /// The end of the output: whatever was held back.
  ParsedOutput finish();

  struct State;

 private:
  std::unique_ptr<State> state_;
};

/// The calls in `text` when it is the output of a forced tool choice (structured output): `required` → a JSON
/// array of {"name", "parameters"}; a named function → the arguments object itself. Throws UsageError when the
/// text is not that JSON (a reply cut by max_tokens).
std::vector<ToolCall> forced_tool_calls(const std::string& text, const std::optional<std::string>& named_function);

}  // namespace fp4serve::server
