// SPDX-License-Identifier: Apache-2.0
#include "runtime/text_setup.h"

#include <fmt/format.h>

#include <algorithm>

#include "fp4serve/error.h"

namespace fp4serve::runtime {
namespace {

using nlohmann::json;

std::string token_string(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) return value["content"];
  return {};
}

void add_ids(const json& value, std::vector<int32_t>& out) {
  auto add = [&](int32_t id) {
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  if (value.is_number_integer()) add(value.get<int32_t>());
  if (value.is_array()) {
    for (const auto& v : value) {
      if (v.is_number_integer()) add(v.get<int32_t>());
    }
  }
}

}  // namespace

text::Tokenizer load_tokenizer(const checkpoint::Checkpoint& ckpt) {
  const auto path = ckpt.tokenizer_json();
  if (!path) throw FormatError(fmt::format("{}: no tokenizer.json (needed to turn text into tokens)", ckpt.root().string()));
  return text::Tokenizer::from_files(*path, ckpt.tokenizer_config());
}

json template_context(const text::Tokenizer& tokenizer, const checkpoint::Checkpoint& ckpt) {
  return template_context(ckpt.tokenizer_config(), &tokenizer);
}

json template_context(const json& tc, const text::Tokenizer* tokenizer) {
  json ctx = json::object();
  if (tc.is_object()) {
    for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
      // transformers' special_tokens_map leaves out tokens that are null.
      if (tc.contains(key) && !tc[key].is_null()) ctx[key] = token_string(tc[key]);
    }
  }
  if (tokenizer != nullptr) {
    if (!ctx.contains("bos_token") && tokenizer->bos_id()) ctx["bos_token"] = tokenizer->id_to_token(*tokenizer->bos_id());
    if (!ctx.contains("eos_token") && tokenizer->eos_id()) ctx["eos_token"] = tokenizer->id_to_token(*tokenizer->eos_id());
  }
  return ctx;
}

nlohmann::ordered_json parse_chat_template_kwargs(const std::string& text) {
  if (text.empty()) return nlohmann::ordered_json::object();
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    throw UsageError("--chat-template-kwargs must be a JSON object such as '{\"enable_thinking\": false}', got: " + text);
  }
  return j;
}

std::vector<int32_t> eos_token_ids(const model::ModelConfig& config, const checkpoint::Checkpoint& ckpt,
                                   const text::Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  const json& g = ckpt.generation_config();
  if (g.is_object() && g.contains("eos_token_id")) add_ids(g["eos_token_id"], ids);
  if (ids.empty()) {
    for (int32_t id : config.eos_token_ids) add_ids(id, ids);
  }
  if (tokenizer.eos_id()) add_ids(*tokenizer.eos_id(), ids);
  return ids;
}

}  // namespace fp4serve::runtime
