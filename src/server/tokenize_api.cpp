// SPDX-License-Identifier: Apache-2.0
#include "server/tokenize_api.h"

#include <fmt/format.h>

#include "fp4serve/error.h"

namespace fp4serve::server {
namespace {

using json = nlohmann::json;

json parse_body(std::string_view body) {
  check_body_nesting(body);
  json doc = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw ApiError(400, "the request body is not valid JSON (UTF-8)");
  if (!doc.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", doc.type_name()));
  return doc;
}

void check_model(const json& doc, const ServeLimits& limits) {
  const auto it = doc.find("model");
  if (it == doc.end() || it->is_null()) return;
  if (!it->is_string() || it->get<std::string>() != limits.model_name) {
    throw ApiError(400, fmt::format("the model {} does not exist; this server serves '{}'", it->dump(), limits.model_name),
                   "model");
  }
}

bool get_flag(const json& doc, const char* name, bool fallback) {
  const auto it = doc.find(name);
  if (it == doc.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw ApiError(400, fmt::format("'{}' must be a boolean, got {}", name, it->type_name()), name);
  return it->get<bool>();
}

}  // namespace

json tokenize_request(std::string_view body, const TextCodec& codec, const ServeLimits& limits) {
  const json doc = parse_body(body);
  check_model(doc, limits);
  const bool chat = doc.contains("messages");
  if (chat == doc.contains("prompt")) throw ApiError(400, "give either 'prompt' or 'messages'");
  std::vector<int32_t> ids;
  try {
    if (chat) {
      // vLLM: a chat prompt already carries the template's special tokens.
      ids = codec.encode(codec.render_chat_prompt(parse_chat_prompt(body)), get_flag(doc, "add_special_tokens", false));
    } else {
      const json& p = doc["prompt"];
      if (!p.is_string()) throw ApiError(400, fmt::format("'prompt' must be a string, got {}", p.type_name()), "prompt");
      ids = codec.encode(p.get<std::string>(), get_flag(doc, "add_special_tokens", true));
    }
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("the prompt cannot be tokenized: {}", e.what()), chat ? "messages" : "prompt");
  }
  return {{"count", ids.size()}, {"max_model_len", limits.context_length}, {"tokens", ids}, {"token_strs", nullptr}};
}

json detokenize_request(std::string_view body, const TextCodec& codec, const ServeLimits& limits) {
  const json doc = parse_body(body);
  check_model(doc, limits);
  const auto it = doc.find("tokens");
  if (it == doc.end() || !it->is_array()) throw ApiError(400, "'tokens' must be a list of token ids", "tokens");
  std::vector<int32_t> ids;
  const int64_t vocab = codec.vocab_size();
  for (const auto& x : *it) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab) {
      throw ApiError(400, fmt::format("token {} is not an id in [0, {})", x.dump(), vocab), "tokens");
    }
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  try {
    return {{"prompt", codec.decode(ids, /*skip_special_tokens=*/false)}};
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("the tokens cannot be decoded: {}", e.what()), "tokens");
  }
}

}  // namespace fp4serve::server
