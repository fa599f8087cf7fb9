// SPDX-License-Identifier: Apache-2.0
// vLLM's /tokenize and /detokenize: clients see exactly the ids a prompt (or a chat, through the chat
// template) becomes, and the text of ids.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "server/openai_api.h"
#include "server/text_codec.h"

namespace fp4serve::server {

/// POST /tokenize. Body: {"prompt": text, "add_special_tokens": true} or {"messages": [...],
/// "add_generation_prompt": true, "add_special_tokens": false, "tools", "documents", "chat_template_kwargs"};
/// "model" optional. Answers {"count", "max_model_len", "tokens": [ids], "token_strs": null}. Throws
/// ApiError(400) naming the field for a bad body, an unknown model, or a template that rejects the chat.
nlohmann::json tokenize_request(std::string_view body, const TextCodec& codec, const ServeLimits& limits);

/// POST /detokenize. Body: {"tokens": [ids]}, "model" optional. Answers {"prompt": text} (special tokens kept,
/// as vLLM decodes). Throws ApiError(400) for a bad body or an id outside the vocabulary.
nlohmann::json detokenize_request(std::string_view body, const TextCodec& codec, const ServeLimits& limits);

}  // namespace fp4serve::server
