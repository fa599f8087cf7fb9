// SPDX-License-Identifier: Apache-2.0
// Glue between a checkpoint folder and the text side: its tokenizer, the variables its chat template expects,
// and the token ids that end generation.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "model/model_config.h"
#include "text/tokenizer.h"

namespace fp4serve::runtime {

/// The tokenizer of `ckpt` (tokenizer.json + tokenizer_config.json). Throws FormatError naming the folder when
/// it has no tokenizer.json.
text::Tokenizer load_tokenizer(const checkpoint::Checkpoint& ckpt);

/// Template variables that HF passes to chat templates: bos_token and eos_token as strings (from
/// tokenizer_config.json, where they may be strings or {"content": …} objects).
nlohmann::json template_context(const text::Tokenizer& tokenizer, const checkpoint::Checkpoint& ckpt);
/// The same from a parsed tokenizer_config.json; `tokenizer` (may be null) fills bos/eos it does not name.
nlohmann::json template_context(const nlohmann::json& tokenizer_config, const text::Tokenizer* tokenizer);

/// `--chat-template-kwargs` text: a JSON object (e.g. {"enable_thinking": false}), keys in their order.
/// Empty text: an empty object. Throws UsageError naming the option when it is not a JSON object.
nlohmann::ordered_json parse_chat_template_kwargs(const std::string& text);

/// Ids that end generation: generation_config.json `eos_token_id` (int or list), else config.json's, plus the
/// tokenizer's eos token; de-duplicated, in that order.
std::vector<int32_t> eos_token_ids(const model::ModelConfig& config, const checkpoint::Checkpoint& ckpt,
                                   const text::Tokenizer& tokenizer);

}  // namespace fp4serve::runtime
