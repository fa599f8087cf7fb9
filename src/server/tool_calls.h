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
// (content never includes a prefix of a marker that may still complete), so the concatenation of every push()
// and finish() is the same however the text was split. A call comes out whole (CallOutput::kWhole: checked to be
// the family's JSON first, else it stays content) or, for streaming, as OpenAI streams it (kStreamed): a first
// piece with the call's name once the model has written it, then the arguments' JSON text in the fragments the
// model writes them. Both give a call's arguments as the model wrote them (the JSON text of its arguments value;
// the decoded string when the model wrote them as a JSON string; "{}" when it wrote none), so the streamed
// fragments of a call concatenate to the whole call's arguments. What a streamed call cannot do is take back a
// name already sent: a call whose arguments turn out not to be JSON stays a call (the whole form makes it
// content), as vLLM's streaming parsers do.
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
  std::string arguments;  ///< JSON text of an object, as the model wrote it
};

/// One piece of a streamed call (OpenAI's delta.tool_calls[i]).
struct ToolCallDelta {
  int index = 0;          ///< the call's position among the output's calls (0, 1, …)
  std::string name;       ///< set on the call's first piece only
  std::string arguments;  ///< the next bytes of the arguments' JSON text (may be empty)
};

/// What a piece of output became.
struct ParsedOutput {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> calls;        ///< CallOutput::kWhole
  std::vector<ToolCallDelta> deltas;  ///< CallOutput::kStreamed
  ParsedOutput& operator+=(ParsedOutput other);
};

/// The calls streamed pieces make: names from the first pieces, arguments concatenated, in index order.
std::vector<ToolCall> assemble_calls(const std::vector<ToolCallDelta>& deltas);

enum class CallOutput { kWhole, kStreamed };

/// Splits a model's output into content, reasoning and tool calls, incrementally. `tools`: nullopt parses no
/// calls (tool_choice none, or no tools); `reasoning`: nullopt parses no reasoning. A call whose body is not the
/// JSON the family writes stays in the content as the model wrote it (as vLLM returns it).
class OutputParser {
 public:
  OutputParser(std::optional<ToolParser> tools, std::optional<ReasoningParser> reasoning,
               CallOutput calls = CallOutput::kWhole);
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
/// array of {"name", "parameters"}; a named function → the arguments object itself. Arguments as the model wrote
/// them. Throws UsageError when the text is not that JSON (a reply cut by max_tokens).
std::vector<ToolCall> forced_tool_calls(const std::string& text, const std::optional<std::string>& named_function);

/// Streams the output of a forced tool choice as it is generated: `required` → each call's name once written,
/// then its parameters' text; a named function → the call at once, then the output as its arguments. The pieces
/// concatenate to forced_tool_calls() of the whole output.
class ForcedCallStream {
 public:
  explicit ForcedCallStream(std::optional<std::string> named_function);
  std::vector<ToolCallDelta> push(std::string_view text);
  std::vector<ToolCallDelta> finish();

 private:
  std::optional<std::string> named_;
  std::string text_;
  int started_ = 0;
  std::vector<size_t> sent_;  // per call: bytes of text_ its arguments were sent up to
  std::string held_space_;    // named: trailing whitespace, sent only if more arguments follow
};

}  // namespace fp4serve::server
