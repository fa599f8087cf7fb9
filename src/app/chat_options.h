// SPDX-License-Identifier: Apache-2.0
// The chat-template options shared by `generate --chat`, `chat`, `serve` and `template`.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "text/chat_template.h"

namespace fp4serve::app {

struct ChatTemplateOptions {
  std::string chat_template;  ///< --chat-template FILE|NAME; empty: the model's own
  std::string kwargs_json;    ///< --chat-template-kwargs JSON
};

/// Adds --chat-template and --chat-template-kwargs to `cmd`.
void add_chat_template_options(CLI::App& cmd, ChatTemplateOptions& opts);

/// The model folder's templates with the override applied; prints the one-line "chat template: <source>" to
/// stderr (unless -q) so the user sees which template renders the prompt.
text::ChatTemplates load_chat_templates(const std::filesystem::path& model_dir, const nlohmann::json& tokenizer_config,
                                           const ChatTemplateOptions& opts);

/// The variables a template sees besides messages: `context` (bos_token, eos_token, ...; runtime::template_context)
/// overridden by --chat-template-kwargs. Throws UsageError for kwargs that are not a JSON object.
nlohmann::ordered_json template_variables(const nlohmann::json& context, const ChatTemplateOptions& opts);

}  // namespace fp4serve::app
