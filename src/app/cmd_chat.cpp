// SPDX-License-Identifier: Apache-2.0
// `fp4serve chat`: an interactive REPL over the model's chat template, keeping the conversation history.
// Commands: /help, /reset, /exit and /quit are handled here, never sent to the model. Line editing and history
// come from libedit when stdin is a terminal (line_editor.h); Ctrl-C stops a reply and keeps the conversation.
// The conversation's keys and values stay in the KV block pool between turns (automatic prefix caching, as the
// server does): each turn's prompt, the whole conversation rendered again, finds the blocks of the turns before
// it by their tokens, and only its new tokens are prefilled.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "app/chat_options.h"
#include "app/commands.h"
#include "app/line_editor.h"
#include "app/log.h"
#include "app/model_options.h"
#include "app/option_values.h"
#include "app/threads.h"
#include "runtime/generator.h"
#include "runtime/text_setup.h"
#include "text/chat_template.h"

namespace fp4serve::app {
namespace {

struct ChatOptions {
  ModelOptions model;
  std::string system;
  int64_t max_new_tokens = 512;
  std::optional<float> temperature;
  std::optional<uint64_t> seed;
  bool prefix_caching = true;
  ChatTemplateOptions chat_template;
};

constexpr const char* kHelp =
    "commands: /help this list | /reset clear the conversation | /exit or /quit (or Ctrl-D) leave\n"
    "keys: arrows and Emacs keys edit the line, Up/Down recall earlier lines, Ctrl-C stops a reply (the\n"
    "conversation is kept) or clears the line\n";

void run_chat(const ChatOptions& opts) {
  const model::LoadedModel loaded = load_model_for(opts.model);
  const text::Tokenizer tokenizer = runtime::load_tokenizer(loaded.checkpoint);
  const auto templates =
      load_chat_templates(loaded.checkpoint.root(), loaded.checkpoint.tokenizer_config(), opts.chat_template);
  const text::ChatTemplate& tmpl = templates.select(false);
  const auto variables = template_variables(runtime::template_context(tokenizer, loaded.checkpoint), opts.chat_template);
  const int64_t max_len = effective_max_model_len(opts.model, loaded.config);
  // One sequence of the context length: the pool holds the conversation, whose blocks stay cached after a turn
  // (released to the pool's LRU queue, tail first) until a later turn's blocks need their room.
  model::KvCache cache = loaded.decoder->make_cache(max_len, 1);
  cache.set_prefix_caching(opts.prefix_caching);
  runtime::SamplingParams sampling = runtime::sampling_defaults(loaded.checkpoint.generation_config());
  if (opts.temperature) sampling.temperature = *opts.temperature;
  sampling.seed = opts.seed;
  const std::vector<int32_t> eos = runtime::eos_token_ids(loaded.config, loaded.checkpoint, tokenizer);

  nlohmann::ordered_json history = nlohmann::ordered_json::array();
  auto turn = [](const char* role, const std::string& content) {
    return nlohmann::ordered_json{{"role", role}, {"content", content}};
  };
  if (!opts.system.empty()) history.push_back(turn("system", opts.system));
  const size_t kept = history.size();
  log_info("fp4serve chat — {} (load {:.2f} s, context {} tokens, {}). /help lists the commands.\n", opts.model.model,
           loaded.load_seconds, max_len, thread_summary());
  LineEditor editor;
  int64_t turns = 0;
  while (true) {
    const LineEditor::Input in = editor.read("> ");
    if (in.status == LineEditor::Status::End) {
      // Ctrl-D (or the end of piped input) leaves the cursor after the prompt; the shell's prompt must not follow it.
      std::fputc('\n', stderr);
      break;
    }
    if (in.status == LineEditor::Status::Interrupted) continue;
    const std::string& line = in.line;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/help") {
      fmt::print(stderr, "{}", kHelp);
      continue;
    }
    if (line == "/reset") {
      fmt::print(stderr, "(history cleared: {} message{} dropped)\n", history.size() - kept,
                 history.size() - kept == 1 ? "" : "s");
      while (history.size() > kept) history.erase(history.size() - 1);
      continue;
    }
    if (line.starts_with('/') && !line.starts_with("//")) {
      fmt::print(stderr, "(unknown command {}; /help lists them; start with // to send a line that begins with /)\n",
                 line.substr(0, line.find(' ')));
      continue;
    }
    history.push_back(turn("user", line.starts_with("//") ? line.substr(1) : line));
    runtime::GenerationRequest request;
    request.prompt = tokenizer.encode(tmpl.render_messages(history, true, variables), false);
    request.sampling = sampling;
    request.max_new_tokens = std::min<int64_t>(opts.max_new_tokens, max_len - static_cast<int64_t>(request.prompt.size()));
    if (request.max_new_tokens <= 0) {
      fmt::print(stderr, "(the conversation, {} tokens, fills the context of {} tokens; /reset to start over)\n",
                 request.prompt.size(), max_len);
      history.erase(history.size() - 1);
      continue;
    }
    request.eos_token_ids = eos;
    // The flag is not cleared here: a Ctrl-C pressed right after Enter belongs to this reply.
    const auto result = runtime::generate(*loaded.decoder, cache, tokenizer, request, [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return !LineEditor::interrupted();
    });
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (result.finish_reason == "abort") {
      fmt::print(stderr, "[interrupted after {} tokens; the partial reply stays in the conversation]\n",
                 result.tokens.size());
    } else if (result.finish_reason == "length") {
      fmt::print(stderr, "[reply cut at {} tokens: {}]\n", result.tokens.size(),
                 request.max_new_tokens < opts.max_new_tokens ? "the context is full, /reset to start over"
                                                              : "the -n/--max-tokens limit; raise it for longer replies");
    }
    log_debug("[turn {}: prompt {} tokens, {} from the prefix cache, {} computed (TTFT {:.3f} s) | {} generated "
              "({:.2f} tokens/s)]\n",
              ++turns, result.prompt_tokens, result.cached_tokens, result.prompt_tokens - result.cached_tokens,
              result.prefill_seconds, result.tokens.size(),
              result.tokens.size() > 1 ? static_cast<double>(result.tokens.size() - 1) /
                                             std::max(result.decode_seconds, 1e-9)
                                       : 0.0);
    history.push_back(turn("assistant", result.text));
  }
}

}  // namespace

void register_chat(CLI::App& root) {
  auto opts = std::make_shared<ChatOptions>();
  CLI::App* cmd = root.add_subcommand("chat", "Interactive chat using the model's chat template");
  add_model_options(*cmd, opts->model);
  cmd->add_option("--system", opts->system, "system prompt");
  add_number_option(*cmd, "-n,--max-tokens", opts->max_new_tokens, ranges::kMaxTokens, "tokens per reply");
  add_number_option(*cmd, "--temperature", opts->temperature, ranges::kTemperature,
                    "0 = greedy (default: generation_config.json)");
  cmd->add_option("--seed", opts->seed, "sampling seed")->check(kSeedCheck);
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", opts->prefix_caching,
                "keep the conversation's KV blocks between turns, so a turn prefills only its new tokens (default on)");
  add_chat_template_options(*cmd, opts->chat_template);
  cmd->callback([opts] { run_chat(*opts); });
}

}  // namespace fp4serve::app
