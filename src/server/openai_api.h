// SPDX-License-Identifier: Apache-2.0
// Request mapping for the OpenAI-compatible API (https://platform.openai.com/docs/api-reference): request JSON →
// validated ApiRequest → tokenized SequenceRequest, and generated text → response / stream-chunk JSON. Every
// rejection is an ApiError carrying the HTTP status and the OpenAI error object; nothing here touches the model.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/sampler.h"
#include "server/request_channel.h"
#include "server/sse.h"
#include "server/structured_request.h"
#include "server/tool_calls.h"
#include "server/tool_request.h"
#include "server/text_codec.h"

namespace fp4serve::server {

/// A request the server refuses, with the HTTP status and OpenAI's error `type`; `param` names the offending
/// field when there is one.
class ApiError : public std::runtime_error {
 public:
  /// `code`: OpenAI's machine-readable code ("model_not_found", "invalid_api_key", "rate_limit_exceeded"), or
  /// empty for null.
  ApiError(int status, std::string message, std::string param = {}, std::string code = {});
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  /// OpenAI's type for the status: invalid_request_error (400), authentication_error (401), not_found_error
  /// (404), rate_limit_error (429), server_error (5xx).
  std::string type() const;
  /// {"error": {"message", "type", "param", "code"}}: param and code are strings or null, as OpenAI sends them.
  nlohmann::json body() const;

 private:
  int status_;
  std::string param_;
  std::string code_;
};

enum class Endpoint { kCompletions, kChatCompletions };

/// The fields of a /v1/completions or /v1/chat/completions body that fp4serve honours, type- and range-checked.
struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                         ///< empty: the served model
  std::string prompt_text;                   ///< completions with a string prompt
  std::vector<int64_t> prompt_ids;           ///< completions with a token-id prompt (checked against the vocab later)
  std::vector<ChatTurn> messages;            ///< chat
  ChatPrompt chat;                           ///< chat: the whole messages, tools, documents, chat_template_kwargs
  std::optional<int64_t> max_tokens;         ///< ≥ 1; absent: the rest of the context
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;                ///< stream_options.include_usage
  bool ignore_eos = false;                   ///< vLLM extension, used by `bench serve` for exact output lengths
  bool return_token_ids = false;             ///< extension: generated ids in each choice (`token_ids`)
  std::vector<std::pair<int64_t, float>> logit_bias;  ///< token id → bias in [−100, 100] added to its logit
  int64_t min_tokens = 0;                    ///< vLLM: EOS and stop_token_ids are blocked before this many tokens
  std::vector<int64_t> stop_token_ids;       ///< vLLM: sampling one of these ends the sequence (not emitted)
  /// Logprobs wanted, with this many top alternatives per token: completions `logprobs: N`, chat
  /// `logprobs: true` + `top_logprobs: N` (0 … 20). Absent: none.
  std::optional<int> logprobs;
  /// Structured output (response_format json_object / json_schema / structural_tag, structured_outputs,
  /// guided_*): compiled against the served vocabulary by to_sequence_request.
  std::optional<OutputConstraint> constraint;
  /// Choices (OpenAI's n, 1 … 128): sampled independently from one prompt (Scheduler::submit_n).
  int n = 1;
  /// Chat with tools (tool_request.h); a forced choice (required, named) is also `constraint`.
  std::optional<ToolRequest> tools;
};

/// Parses and checks a request body. Throws ApiError(400) naming the field on invalid JSON, a non-object body,
/// wrong types, out-of-range values (max_tokens ≤ 0, temperature ∉ [0, 2], top_p ∉ (0, 1], n ∉ [1, 128], …), an empty
/// prompt or message list, content parts other than text (the message names the part's type), malformed
/// structured-output or tool fields (structured_request.h, tool_request.h; a forced tool_choice together with
/// another constraint), options fp4serve does not implement (best_of > 1, echo, suffix, the deprecated
/// functions / function_call), and any field the API does not define: every field either takes effect or is
/// refused.
ApiRequest parse_request(Endpoint endpoint, std::string_view body);

/// The template inputs of a chat body, keys in the order the client sent them (as transformers sees them):
/// messages, tools, documents, chat_template_kwargs (an object), add_generation_prompt (default true).
/// Throws ApiError(400) naming the field for wrong types (the message list itself is checked by parse_request).
ChatPrompt parse_chat_prompt(std::string_view body);

/// Server-side facts a request is checked against.
struct ServeLimits {
  std::string model_name;            ///< the only name /v1/models lists and requests may ask for
  int64_t context_length = 0;        ///< --max-model-len: prompt + max_tokens must fit
  runtime::SamplingParams defaults;  ///< the sampling a request's fields override (runtime::serving_defaults)
  std::optional<int64_t> default_max_tokens;  ///< max_tokens when a request has none (generation config), capped by
                                              ///< the context left; none: the context left
  /// Compiles structured-output constraints against the served vocabulary; null: constrained requests get 400.
  std::shared_ptr<const runtime::GrammarCompiler> grammars;
  /// How the model writes tool calls (--tool-call-parser, or detected); none: tool_choice auto is refused.
  std::optional<ToolParser> tool_parser = std::nullopt;
  /// --reasoning-parser: chat replies split reasoning_content from content.
  std::optional<ReasoningParser> reasoning_parser = std::nullopt;
  /// --structured-outputs-config.disable_any_whitespace: JSON constraints allow no whitespace between tokens
  /// (small models otherwise may loop on newlines), as if every request set disable_any_whitespace.
  bool disable_any_whitespace = false;
};

/// Nesting levels (objects and arrays) a request body, or a JSON schema given as text inside it, may have: the
/// server's own code walks documents recursively (serializing a schema, a chat template's values).
inline constexpr int kMaxRequestNesting = 512;
/// Throws ApiError(400) when `body` nests deeper than kMaxRequestNesting (measured without parsing it).
void check_body_nesting(std::string_view body);

/// Tokenizes `request` (chat: template rendered, then encoded without adding special tokens again) and builds
/// what the scheduler runs. Throws ApiError(404, code model_not_found) for an unknown model name; ApiError(400)
/// for a token id outside the vocabulary (prompt, logit_bias, stop_token_ids), or a prompt + max_tokens beyond
/// the context, with vLLM's message ("This model's maximum context length is N tokens. However, you requested
/// M tokens (P in the messages, C in the completion). …"), or a structured-output constraint the grammar engine
/// rejects (param: the field it came from; the engine's message). A request without a seed gets one drawn here, at
/// arrival, so that its random stream is its own whatever runs beside it.
SequenceRequest to_sequence_request(const ApiRequest& request, const TextCodec& codec, const ServeLimits& limits,
                                    Clock::time_point arrival);

/// Token counts for `usage`.
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  ///< prompt tokens served from the prefix cache (prompt_tokens_details.cached_tokens)
};

nlohmann::json usage_json(const Usage& usage);

/// A complete (non-streamed) response: object text_completion or chat.completion with one choice (n > 1: the
/// server replaces `choices` with one such object per choice, each with its `index`).
nlohmann::json response_json(Endpoint endpoint, const std::string& id, const std::string& model, int64_t created,
                             const std::string& text, const std::string& finish_reason, const Usage& usage,
                             const std::vector<int32_t>* token_ids);

/// One stream chunk with `text` (chat: `delta.content`; the first chat chunk also carries role "assistant") and,
/// on the last chunk, the finish reason. `token_ids` are added when requested.
nlohmann::json chunk_json(Endpoint endpoint, const std::string& id, const std::string& model, int64_t created,
                          const std::string& text, const std::optional<std::string>& finish_reason, bool first,
                          const std::vector<int32_t>* token_ids);

/// One generated token's logprob entry, with its text and its top alternatives (text, logprob), best first.
struct LogprobEntry {
  std::string token;
  double logprob = 0.0;
  std::vector<std::pair<std::string, double>> top;
};

/// A choice's `logprobs` for `entries`: completions {tokens, token_logprobs, top_logprobs (text → logprob, the
/// sampled token included), text_offset (from `text_offset`)}; chat {content: [{token, logprob, bytes,
/// top_logprobs: [{token, logprob, bytes}]}]}.
nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<LogprobEntry>& entries, int64_t text_offset);

/// The final usage-only chunk of a stream (stream_options.include_usage): `choices` empty.
nlohmann::json usage_chunk_json(Endpoint endpoint, const std::string& id, const std::string& model, int64_t created,
                                const Usage& usage);

}  // namespace fp4serve::server
