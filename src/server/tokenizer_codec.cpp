// SPDX-License-Identifier: Apache-2.0
#include "server/tokenizer_codec.h"

#include "fp4serve/error.h"

namespace fp4serve::server {
namespace {

class StreamDetokenizer final : public Detokenizer {
 public:
  StreamDetokenizer(const text::Tokenizer& tokenizer, bool skip_special_tokens)
      : decoder_(tokenizer, skip_special_tokens) {}
  std::string push(int32_t id) override { return decoder_.push(id); }
  std::string flush() override { return decoder_.flush(); }

 private:
  text::StreamDecoder decoder_;
};

}  // namespace

TokenizerCodec::TokenizerCodec(text::Tokenizer tokenizer, std::optional<text::ChatTemplate> chat_template,
                               nlohmann::json template_context, std::vector<int32_t> eos_token_ids)
    : tokenizer_(std::move(tokenizer)),
      template_(std::move(chat_template)),
      context_(std::move(template_context)),
      eos_(std::move(eos_token_ids)) {}

TokenizerCodec::TokenizerCodec(text::Tokenizer tokenizer, std::optional<text::ChatTemplates> chat_templates,
                               nlohmann::ordered_json variables, std::vector<int32_t> eos_token_ids,
                               std::optional<text::ContentFormat> content_format)
    : tokenizer_(std::move(tokenizer)),
      templates_(std::move(chat_templates)),
      variables_(std::move(variables)),
      eos_(std::move(eos_token_ids)),
      content_format_(content_format) {
  for (const auto& [k, v] : variables_.items()) context_[k] = v;
}

std::vector<int32_t> TokenizerCodec::encode(std::string_view text, bool add_special_tokens) const {
  return tokenizer_.encode(text, add_special_tokens);
}

std::string TokenizerCodec::render_chat(const std::vector<ChatTurn>& messages) const {
  if (templates_) {
    ChatPrompt prompt;
    for (const auto& m : messages) prompt.messages.push_back({{"role", m.role}, {"content", m.content}});
    return render_chat_prompt(prompt);
  }
  if (!template_) throw UsageError("the model has no chat template (tokenizer_config.json chat_template); use /v1/completions");
  std::vector<text::ChatMessage> turns;
  turns.reserve(messages.size());
  for (const auto& m : messages) turns.push_back({m.role, m.content});
  return template_->render(turns, /*add_generation_prompt=*/true, context_);
}

std::string TokenizerCodec::render_chat_prompt(const ChatPrompt& prompt) const {
  if (!templates_) {
    if (template_) return TextCodec::render_chat_prompt(prompt);
    throw UsageError("the model has no chat template (chat_template.jinja or tokenizer_config.json chat_template); "
                     "use /v1/completions or start the server with --chat-template FILE");
  }
  nlohmann::ordered_json vars = variables_;
  if (!prompt.tools.is_null()) vars["tools"] = prompt.tools;
  if (!prompt.documents.is_null()) vars["documents"] = prompt.documents;
  for (const auto& [k, v] : prompt.chat_template_kwargs.items()) vars[k] = v;
  const text::ChatTemplate& chosen = templates_->select(!prompt.tools.is_null());
  // A template that concatenates content fails on a list of parts (`str + list`): it gets them joined.
  const text::ContentFormat format = content_format_.value_or(chosen.content_format());
  return chosen.render_messages(text::apply_content_format(prompt.messages, format), prompt.add_generation_prompt, vars);
}

std::string TokenizerCodec::describe_content_format() const {
  if (content_format_) return std::string(text::content_format_name(*content_format_)) + " (--chat-template-content-format)";
  if (!templates_) return {};
  try {
    return std::string(text::content_format_name(templates_->select(false).content_format())) +
           " (detected from the template)";
  } catch (const Error&) {
    return "detected per template";  // named templates without a default: each request's template decides
  }
}

std::string TokenizerCodec::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return tokenizer_.decode(ids, skip_special_tokens);
}

std::unique_ptr<Detokenizer> TokenizerCodec::detokenizer() const {
  return std::make_unique<StreamDetokenizer>(tokenizer_, /*skip_special_tokens=*/true);
}

std::unique_ptr<Detokenizer> TokenizerCodec::detokenizer_keeping_special() const {
  return std::make_unique<StreamDetokenizer>(tokenizer_, /*skip_special_tokens=*/false);
}

}  // namespace fp4serve::server
