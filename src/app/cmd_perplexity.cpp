// SPDX-License-Identifier: Apache-2.0
// `fp4serve perplexity`: sliding-window perplexity of a text file, and KL divergence against a base model.
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/commands.h"
#include "app/log.h"
#include "app/model_options.h"
#include "app/option_values.h"
#include "app/tensor_parallel.h"
#include "fp4serve/error.h"
#include "runtime/perplexity.h"
#include "runtime/text_setup.h"

namespace fp4serve::app {
namespace {

struct PerplexityCliOptions {
  ModelOptions model;
  std::string file;
  std::string kld_base;
  int64_t context = 512;
  int64_t stride = 256;
  int64_t max_tokens = 0;
  bool json = false;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open for reading", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void run_perplexity(const PerplexityCliOptions& opts) {
  ModelOptions model_opts = opts.model;
  TensorParallelRun tp(model_opts);
  if (!tp.leader()) return tp.follow(std::span(&model_opts, 1));
  const RankModel run = tp.load(model_opts);
  const model::LoadedModel& loaded = run.loaded;
  const ContextLimit limit = context_limit(loaded.config);
  if (opts.context > limit.tokens) {
    throw UsageError(fmt::format("--ctx {} is above this model's maximum context length of {} tokens ({})", opts.context,
                                 limit.tokens, limit.source));
  }
  std::optional<model::LoadedModel> base;
  if (!opts.kld_base.empty()) {
    // The base is the reference: it runs whole on rank 0 (the followers are inside the model's steps), and the
    // run-time approximations (bf16 or int8 activations, a cheaper lm_head copy, a 16-bit KV cache) stay off.
    ModelOptions base_opts = model_opts;
    base_opts.model = opts.kld_base;
    base_opts.load.parallel = plan::ParallelConfig{};
    base_opts.load.comm = nullptr;
    base_opts.load.activation_precision = prepare::ActivationPrecision::Fp32;
    base_opts.load.lm_head_dtype = model::LmHeadDtype::Bf16;
    base_opts.load.kv_cache_dtype = model::KvCacheDtype::F32;
    base.emplace(load_model_for(base_opts));
  }
  const text::Tokenizer tokenizer = runtime::load_tokenizer(loaded.checkpoint);
  std::vector<int32_t> tokens = tokenizer.encode(read_file(opts.file), true);
  if (opts.max_tokens > 0 && static_cast<int64_t>(tokens.size()) > opts.max_tokens) tokens.resize(static_cast<size_t>(opts.max_tokens));
  runtime::PerplexityOptions po{opts.context, opts.stride};
  const auto result = runtime::perplexity(run.model(), base ? base->decoder.get() : nullptr, tokens, po,
                                          [](int64_t done, int64_t total) {
                                            if (!log_enabled(LogLevel::Info)) return;
                                            fmt::print(stderr, "\rperplexity: window {}/{}", done, total);
                                            if (done == total) fmt::print(stderr, "\n");
                                          });
  if (opts.json) {
    nlohmann::json out = {{"model", opts.model.model},      {"file", opts.file},
                          {"tokens", tokens.size()},        {"context", opts.context},
                          {"stride", opts.stride},          {"perplexity", result.perplexity},
                          {"tokens_scored", result.tokens_scored}};
    if (base) {
      out["base"] = {{"model", opts.kld_base},
                     {"perplexity", result.base_perplexity},
                     {"mean_kld", result.mean_kld},
                     {"top1_agreement", result.top1_agreement}};
    }
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print("model: {}\nfile: {} ({} tokens, context {}, stride {})\nperplexity: {:.4f} over {} scored tokens\n",
             opts.model.model, opts.file, tokens.size(), opts.context, opts.stride, result.perplexity,
             result.tokens_scored);
  if (base) {
    fmt::print("base: {} perplexity {:.4f}\nmean KLD vs base: {:.6f}\ntop-1 agreement vs base: {:.2f}%\n", opts.kld_base,
               result.base_perplexity, result.mean_kld, 100.0 * result.top1_agreement);
  }
}

}  // namespace

void register_perplexity(CLI::App& root) {
  auto opts = std::make_shared<PerplexityCliOptions>();
  CLI::App* cmd = root.add_subcommand("perplexity", "Sliding-window perplexity of a text file (and KLD vs a base model)");
  add_model_options(*cmd, opts->model, /*context_option=*/false);
  add_tensor_parallel_options(*cmd, opts->model.load.parallel);
  cmd->add_option("-f,--file", opts->file, "text file to score")->required()->check(CLI::ExistingFile);
  add_number_option(*cmd, "-c,--ctx,--ctx-size", opts->context, NumberRange{1},
                    "window length in tokens (at most the model's context length)");
  add_number_option(*cmd, "--stride", opts->stride, NumberRange{1}, "window step in tokens (at most the window)");
  cmd->add_option("--kld-base", opts->kld_base,
                  "base model folder: report mean KL divergence and top-1 agreement (the base runs with fp32 "
                  "activations and the stored lm_head)");
  add_number_option(*cmd, "--max-tokens", opts->max_tokens, NumberRange{0, std::numeric_limits<double>::infinity(), false, false, "0 = all"},
                    "score only the first N tokens of the file (0 = all)");
  cmd->add_flag("--json", opts->json, "print one JSON object instead of text");
  cmd->callback([opts] {
    // Before the model loads (the window is also checked against the model's context length, which needs its config).
    if (opts->stride > opts->context) {
      throw UsageError(fmt::format("--stride {} is above the window -c/--ctx {}: expected a stride in [1, {}]",
                                   opts->stride, opts->context, opts->context));
    }
    run_perplexity(*opts);
  });
}

}  // namespace fp4serve::app
