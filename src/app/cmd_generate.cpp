// SPDX-License-Identifier: Apache-2.0
// `fp4serve generate`: one prompt in, streamed text out on stdout; load and speed figures on stderr.
#include <fmt/format.h>

#include <cstdio>

#include "app/commands.h"
#include "app/model_options.h"
#include "fp4serve/error.h"
#include "runtime/chat_template.h"
#include "runtime/generator.h"
#include "runtime/text_setup.h"
#include "runtime/tokenizer.h"

namespace fp4serve::app {
namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string prompt;
  int64_t max_new_tokens = 64;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool chat = false;
  bool ignore_eos = false;
};

void run_generate(const GenerateOptions& opts) {
  model::LoadOptions load = opts.model.load;

  const model::LoadedModel loaded = model::load_model(opts.model.model_dir, load);
  const runtime::Tokenizer tokenizer = runtime::load_tokenizer(loaded.checkpoint);
  std::string text = opts.prompt;
  if (opts.chat) {
    const auto tmpl = runtime::ChatTemplate::from_tokenizer_config(loaded.checkpoint.tokenizer_config());
    text = tmpl.render({{"user", opts.prompt}}, true, runtime::template_context(tokenizer, loaded.checkpoint));
  }
  runtime::GenerationRequest request;
  request.prompt = tokenizer.encode(text, /*add_special_tokens=*/!opts.chat);
  request.sampling = runtime::sampling_defaults(loaded.checkpoint.generation_config());
  if (opts.temperature) request.sampling.temperature = *opts.temperature;
  if (opts.top_p) request.sampling.top_p = *opts.top_p;
  if (opts.top_k) request.sampling.top_k = *opts.top_k;
  if (opts.min_p) request.sampling.min_p = *opts.min_p;
  if (opts.repetition_penalty) request.sampling.repetition_penalty = *opts.repetition_penalty;
  request.sampling.presence_penalty = opts.presence_penalty;
  request.sampling.frequency_penalty = opts.frequency_penalty;
  request.sampling.seed = opts.seed;
  request.max_new_tokens = opts.max_new_tokens;
  request.stop = opts.stop;
  request.eos_token_ids = runtime::eos_token_ids(loaded.config, loaded.checkpoint, tokenizer);
  request.ignore_eos = opts.ignore_eos;

  const int64_t context = std::max<int64_t>(effective_max_model_len(opts.model, loaded.config),
                                            static_cast<int64_t>(request.prompt.size()) + opts.max_new_tokens);
  model::KvCache cache = loaded.decoder->make_cache(context, 1);
  if (!opts.chat) {  // a completion continues the prompt; a chat reply stands on its own
    std::fputs(opts.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  const auto result = runtime::generate(*loaded.decoder, cache, tokenizer, request, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);  // before the stderr summary, so the two streams do not interleave
  const auto generated = static_cast<double>(result.tokens.size());
  fmt::print(stderr, "load {:.2f} s | prompt {} tokens, {:.1f} tokens/s (TTFT {:.3f} s) | decode {} tokens, {:.2f} tokens/s | finish: {}\n",
             loaded.load_seconds, result.prompt_tokens,
             static_cast<double>(result.prompt_tokens) / std::max(result.prefill_seconds, 1e-9),
             result.prefill_seconds, result.tokens.size(),
             generated > 1 ? (generated - 1) / std::max(result.decode_seconds, 1e-9) : 0.0, result.finish_reason);
}

}  // namespace

void register_generate(CLI::App& root) {
  auto opts = std::make_shared<GenerateOptions>();
  CLI::App* cmd = root.add_subcommand("generate", "Generate text from a prompt (streams to stdout)");
  add_model_options(*cmd, opts->model);
  cmd->add_option("-p,--prompt", opts->prompt, "prompt text")->required();
  cmd->add_option("-n,--max-tokens", opts->max_new_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", opts->temperature, "0 = greedy (default: generation_config.json, else greedy)");
  cmd->add_option("--top-p", opts->top_p, "nucleus sampling mass");
  cmd->add_option("--top-k", opts->top_k, "keep the k most likely tokens and any tied with the k-th, as transformers does (0 = off)");
  cmd->add_option("--min-p", opts->min_p, "drop tokens below min_p times the top probability");
  cmd->add_option("--repetition-penalty", opts->repetition_penalty, "transformers-style repetition penalty");
  cmd->add_option("--presence-penalty", opts->presence_penalty, "OpenAI-style presence penalty");
  cmd->add_option("--frequency-penalty", opts->frequency_penalty, "OpenAI-style frequency penalty");
  cmd->add_option("--seed", opts->seed, "sampling seed");
  cmd->add_option("--stop", opts->stop, "stop string (repeatable)");
  cmd->add_flag("--chat", opts->chat, "wrap the prompt in the model's chat template as a user message");
  cmd->add_flag("--ignore-eos", opts->ignore_eos, "keep generating after an end-of-sequence token");
  cmd->callback([opts] { run_generate(*opts); });
}

}  // namespace fp4serve::app
