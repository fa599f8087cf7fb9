// SPDX-License-Identifier: Apache-2.0
// `fp4serve chat`: an interactive REPL over the model's chat template, keeping the conversation history.
// Commands: /reset clears the history, /exit (or end of input) quits.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>

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
};

void run_chat(const ChatOptions& opts) {
  model::LoadOptions load = opts.model.load;

  const model::LoadedModel loaded = model::load_model(opts.model.model_dir, load);
  const runtime::Tokenizer tokenizer = runtime::load_tokenizer(loaded.checkpoint);
  const auto tmpl = runtime::ChatTemplate::from_tokenizer_config(loaded.checkpoint.tokenizer_config());
  const auto context = runtime::template_context(tokenizer, loaded.checkpoint);
  const int64_t max_len = effective_max_model_len(opts.model, loaded.config);
  model::KvCache cache = loaded.decoder->make_cache(max_len, 1);
  runtime::SamplingParams sampling = runtime::sampling_defaults(loaded.checkpoint.generation_config());
  if (opts.temperature) sampling.temperature = *opts.temperature;
  sampling.seed = opts.seed;

  std::vector<runtime::ChatMessage> history;
  if (!opts.system.empty()) history.push_back({"system", opts.system});
  fmt::print(stderr, "fp4serve chat — {} (load {:.2f} s). /reset clears the history, /exit quits.\n",
             opts.model.model_dir, loaded.load_seconds);
  std::string line;
  while (true) {
    fmt::print(stderr, "> ");
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      history.resize(opts.system.empty() ? 0 : 1);
      fmt::print(stderr, "(history cleared)\n");
      continue;
    }
    if (line.empty()) continue;
    history.push_back({"user", line});
    runtime::GenerationRequest request;
    request.prompt = tokenizer.encode(tmpl.render(history, true, context), false);
    request.sampling = sampling;
    request.max_new_tokens = std::min<int64_t>(opts.max_new_tokens, max_len - static_cast<int64_t>(request.prompt.size()));
    if (request.max_new_tokens <= 0) {
      fmt::print(stderr, "(the conversation is longer than the context of {} tokens; /reset to start over)\n", max_len);
      history.pop_back();
      continue;
    }
    request.eos_token_ids = runtime::eos_token_ids(loaded.config, loaded.checkpoint, tokenizer);
    const auto result = runtime::generate(*loaded.decoder, cache, tokenizer, request, [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::fputc('\n', stdout);
    history.push_back({"assistant", result.text});
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
  cmd->callback([opts] { run_chat(*opts); });
}

}  // namespace fp4serve::app
