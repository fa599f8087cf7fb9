// SPDX-License-Identifier: Apache-2.0
// `fp4serve template`: prints the prompt a model's chat template makes of a conversation, exactly as the
// engine renders it (no weights are loaded), so users can compare it with transformers' apply_chat_template.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "app/chat_options.h"
#include "app/commands.h"
#include "app/model_options.h"
#include "checkpoint/checkpoint.h"
#include "fp4serve/error.h"
#include "runtime/text_setup.h"
#include "text/tokenizer.h"

namespace fp4serve::app {
namespace {

struct TemplateOptions {
  std::string model_dir;
  std::string messages_file;
  bool add_generation_prompt = false;
  bool token_ids = false;
  ChatTemplateOptions chat;
};

nlohmann::ordered_json read_messages_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open --messages file " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto j = nlohmann::ordered_json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw FormatError(path + ": not valid JSON");
  if (j.is_array()) return nlohmann::ordered_json{{"messages", std::move(j)}};
  if (!j.is_object() || !j.contains("messages") || !j["messages"].is_array()) {
    throw FormatError(path + ": expected a list of messages, or an object with \"messages\" (and optionally \"tools\", "
                      "\"documents\"), found " + std::string(j.type_name()));
  }
  return j;
}

void run_template(const TemplateOptions& opts) {
  const std::filesystem::path dir = opts.model_dir;
  const auto config_path = dir / "tokenizer_config.json";
  nlohmann::json tokenizer_config = nlohmann::json::object();
  std::error_code ec;
  if (std::filesystem::is_regular_file(config_path, ec)) tokenizer_config = checkpoint::read_json_object_file(config_path);
  std::optional<text::Tokenizer> tokenizer;
  if (std::filesystem::is_regular_file(dir / "tokenizer.json", ec)) {
    tokenizer = text::Tokenizer::from_files(dir / "tokenizer.json", tokenizer_config);
  }
  const text::ChatTemplates templates = load_chat_templates(dir, tokenizer_config, opts.chat);
  const nlohmann::ordered_json request = read_messages_file(opts.messages_file);
  const bool with_tools = request.contains("tools") && !request["tools"].is_null();

  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  const nlohmann::json context = runtime::template_context(tokenizer_config, tokenizer ? &*tokenizer : nullptr);
  for (const auto& [k, v] : context.items()) variables[k] = v;
  for (const char* key : {"tools", "documents"}) {
    if (request.contains(key)) variables[key] = request[key];
  }
  const auto kwargs = runtime::parse_chat_template_kwargs(opts.chat.kwargs_json);
  for (const auto& [k, v] : kwargs.items()) variables[k] = v;

  const std::string text =
      templates.select(with_tools).render_messages(request["messages"], opts.add_generation_prompt, variables);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  if (opts.token_ids) {
    if (!tokenizer) throw UsageError(dir.string() + ": --token-ids needs tokenizer.json");
    const auto ids = tokenizer->encode(text, /*add_special_tokens=*/false);
    fmt::print(stderr, "\n{} tokens: [{}]\n", ids.size(), fmt::join(ids, ", "));
  }
}

}  // namespace

void register_template(CLI::App& root) {
  auto opts = std::make_shared<TemplateOptions>();
  CLI::App* cmd = root.add_subcommand("template", "Print the prompt the chat template makes of a conversation");
  add_model_path_option(*cmd, opts->model_dir, "model or tokenizer folder (tokenizer_config.json / chat_template.jinja)");
  cmd->add_option("--messages", opts->messages_file,
                  "JSON file: a list of OpenAI-style messages, or {\"messages\": [...], \"tools\": [...]}")
      ->required();
  cmd->add_flag("--add-generation-prompt", opts->add_generation_prompt, "end with the assistant turn's header");
  cmd->add_flag("--token-ids", opts->token_ids, "also print the prompt's token ids (stderr)");
  add_chat_template_options(*cmd, opts->chat);
  cmd->callback([opts] { run_template(*opts); });
}

}  // namespace fp4serve::app
