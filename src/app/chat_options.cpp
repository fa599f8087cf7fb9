// SPDX-License-Identifier: Apache-2.0
#include "app/chat_options.h"

#include <fmt/format.h>

#include <cstdio>

#include "app/log.h"
#include "runtime/text_setup.h"

namespace fp4serve::app {

void add_chat_template_options(CLI::App& cmd, ChatTemplateOptions& opts) {
  cmd.add_option("--chat-template", opts.chat_template,
                 "chat template: a Jinja file, or the name of one of tokenizer_config.json's named templates "
                 "(default: chat_template.jinja, else tokenizer_config.json's chat_template)");
  cmd.add_option("--chat-template-kwargs", opts.kwargs_json,
                 "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'");
}

text::ChatTemplates load_chat_templates(const std::filesystem::path& model_dir, const nlohmann::json& tokenizer_config,
                                           const ChatTemplateOptions& opts) {
  text::ChatTemplates templates = text::ChatTemplates::load(model_dir, tokenizer_config, opts.chat_template);
  log_info("{}\n", templates.describe());  // -q: errors only
  return templates;
}

nlohmann::ordered_json template_variables(const nlohmann::json& context, const ChatTemplateOptions& opts) {
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  for (const auto& [k, v] : context.items()) vars[k] = v;
  const auto kwargs = runtime::parse_chat_template_kwargs(opts.kwargs_json);  // items() views must not outlive it
  for (const auto& [k, v] : kwargs.items()) vars[k] = v;
  return vars;
}

}  // namespace fp4serve::app
