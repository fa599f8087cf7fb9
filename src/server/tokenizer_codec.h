// SPDX-License-Identifier: Apache-2.0
// The production TextCodec: the checkpoint's tokenizer and chat template. Both are immutable after loading, so
// handler threads share one codec; each request gets its own StreamDecoder.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "server/text_codec.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace fp4serve::server {

class TokenizerCodec final : public TextCodec {
 public:
  /// `chat_template` absent: chat requests get 400 ("the model has no chat template"). `template_context` holds
  /// the variables HF passes to templates (bos_token, eos_token; runtime::template_context).
  TokenizerCodec(text::Tokenizer tokenizer, std::optional<text::ChatTemplate> chat_template,
                 nlohmann::json template_context, std::vector<int32_t> eos_token_ids);
  /// A model folder's templates (text::ChatTemplates: "tool_use" for requests with tools). `variables`:
  /// template_context plus the server's --chat-template-kwargs, which a request's chat_template_kwargs override.
  /// `content_format`: how list contents reach the template (--chat-template-content-format); nullopt ("auto"):
  /// what each template's syntax asks for (text::ChatTemplate::content_format).
  TokenizerCodec(text::Tokenizer tokenizer, std::optional<text::ChatTemplates> chat_templates,
                 nlohmann::ordered_json variables, std::vector<int32_t> eos_token_ids,
                 std::optional<text::ContentFormat> content_format = std::nullopt);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string render_chat(const std::vector<ChatTurn>& messages) const override;
  std::string render_chat_prompt(const ChatPrompt& prompt) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;
  std::unique_ptr<Detokenizer> detokenizer() const override;
  std::unique_ptr<Detokenizer> detokenizer_keeping_special() const override;
  int64_t vocab_size() const override { return tokenizer_.vocab_size(); }
  std::optional<int32_t> token_id(std::string_view token) const override { return tokenizer_.token_to_id(token); }
  std::vector<int32_t> eos_token_ids() const override { return eos_; }
  /// The content format plain chat requests are rendered with and where it comes from, for the startup log:
  /// "string (detected from the template)", "openai (--chat-template-content-format)"; empty without templates.
  std::string describe_content_format() const;

 private:
  text::Tokenizer tokenizer_;
  std::optional<text::ChatTemplate> template_;
  std::optional<text::ChatTemplates> templates_;
  nlohmann::json context_;
  nlohmann::ordered_json variables_;
  std::vector<int32_t> eos_;
  std::optional<text::ContentFormat> content_format_;
};

}  // namespace fp4serve::server
