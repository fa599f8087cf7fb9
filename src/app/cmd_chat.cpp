// SPDX-License-Identifier: Apache-2.0
// `fp4serve chat`: an interactive REPL over the model's chat template, keeping the conversation history.
// Commands: /reset clears the history, /exit (or end of input) quits.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>

#include "app/chat_options.h"
#include "app/commands.h"
#include "app/model_options.h"
#include "runtime/chat_template.h"
#include "runtime/generator.h"
#include "runtime/text_setup.h"

namespace fp4serve::app {
namespace {

struct ChatOptions {
  ModelOptions model;
  std::string system;
  int64_t max_new_tokens = 512;
  std::optional<float> temperature;
  std::optional<uint64_t> seed;
  ChatTemplateOptions chat_template;
};

void run_chat(const ChatOptions& opts) {
  model::LoadOptions load = opts.model.load;
  load.gpu_run = true;  // driven through ForwardModel only, so --device cuda can run on the GPU
  const model::LoadedModel loaded = model::load_model(opts.model.model_dir, load);
  const runtime::Tokenizer tokenizer = runtime::load_tokenizer(loaded.checkpoint);
  const auto templates =
      load_chat_templates(loaded.checkpoint.root(), loaded.checkpoint.tokenizer_config(), opts.chat_template);
  const runtime::ChatTemplate& tmpl = templates.select(false);
  const auto variables = template_variables(runtime::template_context(tokenizer, loaded.checkpoint), opts.chat_template);
  const int64_t max_len = effective_max_model_len(opts.model, loaded.config);
  model::KvCache cache = loaded.forward_model().make_cache(max_len, 1);
  runtime::SamplingParams sampling = runtime::sampling_defaults(loaded.checkpoint.generation_config());
  if (opts.temperature) sampling.temperature = *opts.temperature;
  sampling.seed = opts.seed;

  nlohmann::ordered_json history = nlohmann::ordered_json::array();
  auto turn = [](const char* role, const std::string& content) {
    return nlohmann::ordered_json{{"role", role}, {"content", content}};
  };
  if (!opts.system.empty()) history.push_back(turn("system", opts.system));
  fmt::print(stderr, "fp4serve chat — {} (load {:.2f} s). /reset clears the history, /exit quits.\n",
             opts.model.model_dir, loaded.load_seconds);
  std::string line;
  while (true) {
    fmt::print(stderr, "> ");
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      while (history.size() > (opts.system.empty() ? 0u : 1u)) history.erase(history.size() - 1);
      fmt::print(stderr, "(history cleared)\n");
      continue;
    }
    if (line.empty()) continue;
    history.push_back(turn("user", line));
    runtime::GenerationRequest request;
    request.prompt = tokenizer.encode(tmpl.render_messages(history, true, variables), false);
    request.sampling = sampling;
    request.max_new_tokens = std::min<int64_t>(opts.max_new_tokens, max_len - static_cast<int64_t>(request.prompt.size()));
    if (request.max_new_tokens <= 0) {
      fmt::print(stderr, "(the conversation is longer than the context of {} tokens; /reset to start over)\n", max_len);
      history.erase(history.size() - 1);
      continue;
    }
    request.eos_token_ids = runtime::eos_token_ids(loaded.config, loaded.checkpoint, tokenizer);
    const auto result = runtime::generate(loaded.forward_model(), cache, tokenizer, request, [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::fputc('\n', stdout);
    history.push_back(turn("assistant", result.text));
  }
}

}  // namespace

void register_chat(CLI::App& root) {
  auto opts = std::make_shared<ChatOptions>();
  CLI::App* cmd = root.add_subcommand("chat", "Interactive chat using the model's chat template");
  add_model_options(*cmd, opts->model);
  cmd->add_option("--system", opts->system, "system prompt");
  cmd->add_option("-n,--max-tokens", opts->max_new_tokens, "tokens per reply")->capture_default_str();
  cmd->add_option("--temperature", opts->temperature, "0 = greedy (default: generation_config.json)");
  cmd->add_option("--seed", opts->seed, "sampling seed");
  add_chat_template_options(*cmd, opts->chat_template);
  cmd->callback([opts] { run_chat(*opts); });
}

}  // namespace fp4serve::app
