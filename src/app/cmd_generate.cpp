// SPDX-License-Identifier: Apache-2.0
// `fp4serve generate`: one prompt in, streamed text out on stdout; load and speed figures on stderr.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/chat_options.h"
#include "app/commands.h"
#include "app/log.h"
#include "app/model_options.h"
#include "app/option_values.h"
#include "app/tensor_parallel.h"
#include "app/threads.h"
#include "core/threading.h"
#include "fp4serve/error.h"
#include "runtime/generator.h"
#include "runtime/text_setup.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace fp4serve::app {
namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string prompt;
  std::string prompt_file;
  int64_t max_new_tokens = 64;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool chat = false;
  ChatTemplateOptions chat_template;
  bool ignore_eos = false;
  bool json = false;
};

std::string read_all(std::istream& in) {
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// -p TEXT, -p - (stdin) or -f FILE, as llama.cpp takes them.
std::string prompt_text(const GenerateOptions& opts) {
  if (!opts.prompt_file.empty()) {
    std::ifstream in(opts.prompt_file, std::ios::binary);
    if (!in) throw UsageError(fmt::format("-f {}: cannot open for reading", opts.prompt_file));
    return read_all(in);
  }
  if (opts.prompt == "-") return read_all(std::cin);
  return opts.prompt;
}

void run_generate(const GenerateOptions& opts) {
  ModelOptions model_opts = opts.model;
  TensorParallelRun tp(model_opts);
  if (!tp.leader()) return tp.follow(std::span(&model_opts, 1));
  const std::string prompt = prompt_text(opts);
  if (prompt.empty()) throw UsageError("the prompt is empty (-p TEXT, -p - for stdin, or -f FILE)");
  const RankModel run = tp.load(model_opts);
  const model::LoadedModel& loaded = run.loaded;
  const text::Tokenizer tokenizer = runtime::load_tokenizer(loaded.checkpoint);
  std::string text = prompt;
  if (opts.chat) {
    const auto templates =
        load_chat_templates(loaded.checkpoint.root(), loaded.checkpoint.tokenizer_config(), opts.chat_template);
    const nlohmann::ordered_json messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", prompt}}});
    text = templates.select(false).render_messages(
        messages, true, template_variables(runtime::template_context(tokenizer, loaded.checkpoint), opts.chat_template));
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

  // Refused before generating, like vLLM's "This model's maximum context length is …" (never a mid-output
  // failure at the end of the RoPE table).
  const int64_t context = effective_max_model_len(opts.model, loaded.config);
  const auto prompt_tokens = static_cast<int64_t>(request.prompt.size());
  if (opts.max_new_tokens > context - prompt_tokens) {  // not prompt + n: n may be near INT64_MAX
    const ContextLimit limit = context_limit(loaded.config);
    throw UsageError(fmt::format(
        "the prompt ({} tokens) plus --max-tokens {} is {} tokens, above the context length of {} tokens ({}); "
        "shorten the prompt or lower -n",
        prompt_tokens, opts.max_new_tokens,
        static_cast<uint64_t>(prompt_tokens) + static_cast<uint64_t>(opts.max_new_tokens), context,
        opts.model.max_model_len > 0 ? fmt::format("--max-model-len; the model allows {}", limit.tokens) : limit.source));
  }
  // The cache holds what this request can use, not the whole context: one sequence, allocated up front.
  model::KvCache cache = run.model().make_cache(prompt_tokens + opts.max_new_tokens, 1);
  if (!opts.chat && !opts.json) {  // a completion continues the prompt; a chat reply stands on its own
    std::fputs(prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  const bool stream = !opts.json;
  const auto result = runtime::generate(run.model(), cache, tokenizer, request, [stream](std::string_view piece) {
    if (stream) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  });
  const auto generated = static_cast<double>(result.tokens.size());
  const double prefill_tps = static_cast<double>(result.prompt_tokens) / std::max(result.prefill_seconds, 1e-9);
  const double decode_tps = generated > 1 ? (generated - 1) / std::max(result.decode_seconds, 1e-9) : 0.0;
  const bool gpu = loaded.device == plan::DeviceKind::Cuda;
  const std::string device = gpu ? std::string("GPU") : thread_summary();
  if (opts.json) {
    const nlohmann::json out = {{"model", opts.model.model},
                                {"text", result.text},
                                {"prompt_tokens", result.prompt_tokens},
                                {"completion_tokens", result.tokens.size()},
                                {"finish_reason", result.finish_reason},
                                {"load_seconds", loaded.load_seconds},
                                {"ttft_seconds", result.prefill_seconds},
                                {"prefill_tokens_per_s", prefill_tps},
                                {"decode_tokens_per_s", decode_tps},
                                {"device", gpu ? "cuda" : "cpu"},
                                {"kv_cache_dtype", model::kv_cache_dtype_name(loaded.kv_element)},
                                {"activation_precision", prepare::activation_precision_name(loaded.activation_precision)},
                                {"int4_activation_precision", prepare::activation_precision_name(loaded.int4_activation_precision)},
                                {"threads", core::num_threads()},
                                {"threads_note", device}};
    fmt::print("{}\n", out.dump(2));
    return;
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);  // before the stderr summary, so the two streams do not interleave
  log_info("load {:.2f} s | prompt {} tokens, {:.1f} tokens/s (TTFT {:.3f} s) | decode {} tokens, {:.2f} tokens/s | "
           "finish: {} | {} | KV cache {} | activations {}\n",
           loaded.load_seconds, result.prompt_tokens, prefill_tps, result.prefill_seconds, result.tokens.size(),
           decode_tps, result.finish_reason, device, model::kv_cache_dtype_name(loaded.kv_element),
           model::activation_precision_summary(loaded));
}

}  // namespace

void register_generate(CLI::App& root) {
  auto opts = std::make_shared<GenerateOptions>();
  CLI::App* cmd = root.add_subcommand("generate", "Generate text from a prompt (streams to stdout)");
  add_model_options(*cmd, opts->model);
  add_tensor_parallel_options(*cmd, opts->model.load.parallel);
  auto* prompt = cmd->add_option("-p,--prompt", opts->prompt, "prompt text; - reads it from stdin");
  auto* file = cmd->add_option("-f,--file", opts->prompt_file, "read the prompt from a file")->check(CLI::ExistingFile);
  prompt->excludes(file);
  file->excludes(prompt);
  cmd->add_flag("--json", opts->json, "print one JSON object (text, token counts, finish reason, speed) instead of streaming");
  // Checked as they are read, so that a bad value stops the command before the model loads (not after the prompt
  // was echoed, and not as a KV-cache error for -n -3).
  add_number_option(*cmd, "-n,--max-tokens", opts->max_new_tokens, ranges::kMaxTokens, "tokens to generate");
  add_number_option(*cmd, "--temperature", opts->temperature, ranges::kTemperature,
                    "0 = greedy (default: generation_config.json, else greedy)");
  add_number_option(*cmd, "--top-p", opts->top_p, ranges::kTopP, "nucleus sampling mass");
  add_number_option(*cmd, "--top-k", opts->top_k, ranges::kTopK,
                    "keep the k most likely tokens and any tied with the k-th, as transformers does (0 = off)");
  add_number_option(*cmd, "--min-p", opts->min_p, ranges::kMinP, "drop tokens below min_p times the top probability");
  add_number_option(*cmd, "--repetition-penalty", opts->repetition_penalty, ranges::kRepetitionPenalty,
                    "transformers-style repetition penalty");
  add_number_option(*cmd, "--presence-penalty", opts->presence_penalty, ranges::kPresenceFrequencyPenalty,
                    "OpenAI-style presence penalty");
  add_number_option(*cmd, "--frequency-penalty", opts->frequency_penalty, ranges::kPresenceFrequencyPenalty,
                    "OpenAI-style frequency penalty");
  cmd->add_option("--seed", opts->seed, "sampling seed")->check(kSeedCheck);
  cmd->add_option("--stop", opts->stop, "stop string (repeatable)");
  cmd->add_flag("--chat", opts->chat, "wrap the prompt in the model's chat template as a user message");
  add_chat_template_options(*cmd, opts->chat_template);
  cmd->add_flag("--ignore-eos", opts->ignore_eos, "keep generating after an end-of-sequence token");
  cmd->callback([opts, prompt, file] {
    if (prompt->count() == 0 && file->count() == 0) throw UsageError("generate needs a prompt: -p TEXT, -p - (stdin) or -f FILE");
    run_generate(*opts);
  });
}

}  // namespace fp4serve::app
