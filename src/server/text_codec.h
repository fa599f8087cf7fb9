// SPDX-License-Identifier: Apache-2.0
// Text ↔ tokens for the HTTP layer: prompt encoding, chat-template rendering and incremental detokenization.
// The production implementation (tokenizer_codec.h) wraps text::Tokenizer and text::ChatTemplate. Every
// method is called from HTTP handler threads concurrently, so implementations must be immutable after
// construction; per-request state lives in the Detokenizer each request creates.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp4serve/error.h"

namespace fp4serve::server {

struct ChatTurn {
  std::string role;
  std::string content;
};

/// A chat request as the template sees it (transformers' apply_chat_template arguments).
struct ChatPrompt {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  ///< as the request sent them, any fields
  nlohmann::ordered_json tools;                  ///< null: none
  nlohmann::ordered_json documents;              ///< null: none
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();  ///< extra template variables
  bool add_generation_prompt = true;
};

/// Turns generated ids into text piece by piece without splitting UTF-8 sequences. One per request.
class Detokenizer {
 public:
  virtual ~Detokenizer() = default;
  /// Text that became final with `id` (may be empty while a multi-byte character is incomplete).
  virtual std::string push(int32_t id) = 0;
  /// Whatever is still held back at the end of generation.
  virtual std::string flush() = 0;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  /// The chat template applied to `messages` with the generation prompt appended. Throws fp4serve::Error when
  /// the template rejects the conversation (the server answers 400 with the message).
  virtual std::string render_chat(const std::vector<ChatTurn>& messages) const = 0;
  /// The chat template applied to a whole request (all message fields, tools, documents, kwargs). The default
  /// serves codecs that know only role + text (text parts concatenated): it refuses tools, documents, kwargs and
  /// add_generation_prompt = false with UnsupportedError.
  virtual std::string render_chat_prompt(const ChatPrompt& prompt) const {
    if (!prompt.tools.is_null() || !prompt.documents.is_null() || !prompt.chat_template_kwargs.empty() ||
        !prompt.add_generation_prompt) {
      throw UnsupportedError("this text codec renders only role/content messages");
    }
    std::vector<ChatTurn> turns;
    for (const auto& m : prompt.messages) {
      std::string text;
      const auto content = m.find("content");
      if (content != m.end() && content->is_string()) text = content->get<std::string>();
      if (content != m.end() && content->is_array()) {  // text parts, concatenated
        for (const auto& part : *content) text += part.value("text", "");
      }
      turns.push_back({m.value("role", ""), std::move(text)});
    }
    return render_chat(turns);
  }
  /// Text of `ids` (for /detokenize). The default refuses with UnsupportedError.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
    (void)ids;
    (void)skip_special_tokens;
    throw UnsupportedError("this text codec cannot decode");
  }
  virtual std::unique_ptr<Detokenizer> detokenizer() const = 0;
  /// A detokenizer that keeps special tokens in the text (tool-call parsers whose markers are special tokens:
  /// Mistral's [TOOL_CALLS], GPT-OSS's harmony). Default: detokenizer().
  virtual std::unique_ptr<Detokenizer> detokenizer_keeping_special() const { return detokenizer(); }
  virtual int64_t vocab_size() const = 0;
  /// The id of a token spelled exactly `token` ("</think>"), or nullopt. Default: none.
  virtual std::optional<int32_t> token_id(std::string_view token) const {
    (void)token;
    return std::nullopt;
  }
  /// Ids that end generation unless the request sets ignore_eos.
  virtual std::vector<int32_t> eos_token_ids() const = 0;
};

}  // namespace fp4serve::server
