// SPDX-License-Identifier: Apache-2.0
// Request mapping for the OpenAI-compatible API (https://platform.openai.com/docs/api-reference): request JSON →
// validated ApiRequest → tokenized SequenceRequest, and generated text → response / stream-chunk JSON. Every
// rejection is an ApiError carrying the HTTP status and the OpenAI error object; nothing here touches the model.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/sampler.h"
#include "server/request_channel.h"
#include "server/sse.h"
#include "server/text_codec.h"

namespace fp4serve::server {

/// A request the server refuses, with the HTTP status and OpenAI's error `type`; `param` names the offending
/// field when there is one.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {});
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  /// OpenAI's type for the status: invalid_request_error (400), authentication_error (401), not_found_error
  /// (404), rate_limit_error (429), server_error (5xx).
  std::string type() const;
  /// {"error": {"message", "type", "param", "code"}}; code is the status as OpenAI-compatible servers send it.
  nlohmann::json body() const;

 private:
  int status_;
  std::string param_;
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
};

/// Parses and checks a request body. Throws ApiError(400) naming the field on invalid JSON, a non-object body,
/// wrong types, out-of-range values (max_tokens ≤ 0, temperature ∉ [0, 2], top_p ∉ (0, 1], n ≠ 1, …), an empty
/// prompt or message list, and options fp4serve does not implement (logprobs, best_of, echo, suffix, functions,
/// tools on completions, a tool_choice other than "auto" / "none").
ApiRequest parse_request(Endpoint endpoint, std::string_view body);

/// The template inputs of a chat body, keys in the order the client sent them (as transformers sees them):
/// messages, tools, documents, chat_template_kwargs (an object), add_generation_prompt (default true).
/// Throws ApiError(400) naming the field for wrong types (the message list itself is checked by parse_request).
ChatPrompt parse_chat_prompt(std::string_view body);

/// Server-side facts a request is checked against.
struct ServeLimits {
  std::string model_name;            ///< the only name /v1/models lists and requests may ask for
  int64_t context_length = 0;        ///< --max-model-len: prompt + max_tokens must fit
  runtime::SamplingParams defaults;  ///< generation_config.json defaults the request overrides
};

/// Tokenizes `request` (chat: template rendered, then encoded without adding special tokens again) and builds
/// what the scheduler runs. Throws ApiError(400) for an unknown model name, a token id outside the vocabulary,
/// a prompt that leaves no room in the context (prompt ≥ context_length), or prompt + max_tokens > context.
SequenceRequest to_sequence_request(const ApiRequest& request, const TextCodec& codec, const ServeLimits& limits,
                                    Clock::time_point arrival);

/// Token counts for `usage`.
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

nlohmann::json usage_json(const Usage& usage);

/// A complete (non-streamed) response: object text_completion or chat.completion with one choice.
nlohmann::json response_json(Endpoint endpoint, const std::string& id, const std::string& model, int64_t created,
                             const std::string& text, const std::string& finish_reason, const Usage& usage,
                             const std::vector<int32_t>* token_ids);

/// One stream chunk with `text` (chat: `delta.content`; the first chat chunk also carries role "assistant") and,
/// on the last chunk, the finish reason. `token_ids` are added when requested.
nlohmann::json chunk_json(Endpoint endpoint, const std::string& id, const std::string& model, int64_t created,
                          const std::string& text, const std::optional<std::string>& finish_reason, bool first,
                          const std::vector<int32_t>* token_ids);

/// The final usage-only chunk of a stream (stream_options.include_usage): `choices` empty.
nlohmann::json usage_chunk_json(Endpoint endpoint, const std::string& id, const std::string& model, int64_t created,
                                const Usage& usage);

}  // namespace fp4serve::server
