// SPDX-License-Identifier: Apache-2.0
// `fp4serve bench serve`: load generator against a running OpenAI-compatible server (src/server/bench_client.h),
// printing the same report as `vllm bench serve`, or JSON. `fp4serve bench model`: offline prefill/decode speed
// of one or more checkpoints in one interleaved run (runtime/model_bench.h).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/log.h"
#include "app/model_options.h"
#include "app/option_values.h"
#include "app/tensor_parallel.h"
#include "backends/load_model.h"
#include "core/memory_stats.h"
#include "runtime/model_bench.h"
#include "server/bench_client.h"

namespace fp4serve::app {
namespace {

struct ModelBenchOptions {
  std::vector<std::string> models;
  model::LoadOptions load = cli_load_options();
  // Every model runs with each value (interleaved); std::nullopt = auto.
  std::vector<std::optional<prepare::ActivationPrecision>> activation_precisions{std::nullopt};
  std::vector<model::LmHeadDtype> lm_head_dtypes{model::LmHeadDtype::Bf16};
  std::vector<std::optional<model::KvCacheDtype>> kv_cache_dtypes{std::nullopt};
  std::vector<bool> batch_invariant{false};
  runtime::ModelBenchConfig bench;
  bool json = false;
};

void run_bench_model(const ModelBenchOptions& opts) {
  ModelOptions first;
  first.load = opts.load;
  if (!opts.models.empty()) first.model = opts.models.front();  // -tp checked against it before any launch
  TensorParallelRun tp(first);
  // One target per model × activation precision × lm_head copy × KV cache element × batch-invariant mode, in the order the bench runs
  // them; every rank loads the same list (per_model), so the followers can build it without rank 0's names.
  std::vector<runtime::ModelBenchTarget> targets;
  std::vector<std::string> names;
  std::vector<ModelOptions> per_model;
  for (const std::string& dir : opts.models) {
    const std::string path = resolve_model_path(dir).string();
    for (const std::optional<prepare::ActivationPrecision> precision : opts.activation_precisions) {
      for (const model::LmHeadDtype lm_head : opts.lm_head_dtypes) {
        for (const std::optional<model::KvCacheDtype> kv : opts.kv_cache_dtypes) {
          for (const bool invariant : opts.batch_invariant) {
            ModelOptions target = first;
            target.model = dir;
            target.load.activation_precision = precision;
            target.load.lm_head_dtype = lm_head;
            target.load.kv_cache_dtype = kv;
            target.load.batch_invariant = invariant;
            std::string name = dir;
            if (opts.activation_precisions.size() > 1) name += " a:" + activation_precision_text(precision);
            if (opts.lm_head_dtypes.size() > 1) name += fmt::format(" lm_head:{}", model::lm_head_dtype_name(lm_head));
            if (opts.kv_cache_dtypes.size() > 1) name += " kv:" + kv_cache_dtype_text(kv);
            if (opts.batch_invariant.size() > 1) name += invariant ? " batch-invariant:on" : " batch-invariant:off";
            names.push_back(name);
            targets.push_back({name, path, target.load});
            per_model.push_back(std::move(target));
          }
        }
      }
    }
  }
  if (!tp.leader()) return tp.follow(per_model);
  // Per model and repetition: the load's seconds, the anonymous memory right after it (the weights as loaded and
  // the runtime's buffers, no KV cache yet) and the peak RSS of the load and run (VmHWM, reset before each load).
  struct Memory {
    std::vector<double> load_seconds;
    int64_t anon_after_load = 0, peak_rss = 0;
  };
  std::vector<Memory> memory(targets.size());
  const auto loader = [&](size_t i, const runtime::ModelBenchTarget&) {
    core::reset_peak_rss();
    const auto start = std::chrono::steady_clock::now();
    RankModel loaded = tp.load(per_model[i], i);
    memory[i].load_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    memory[i].anon_after_load = std::max(memory[i].anon_after_load, core::process_memory().anon);
    return runtime::BenchModel{std::move(loaded.loaded), std::move(loaded.tp)};
  };
  const auto samples = runtime::run_model_bench(targets, opts.bench, [&](size_t m, int r, const runtime::ModelBenchSample& s) {
    memory[m].peak_rss = std::max(memory[m].peak_rss, core::process_memory().peak_rss);
    log_info("bench model: repetition {} {}: prefill {:.3f} s, decode {:.3f} s\n", r + 1, names[m],
               s.prefill_seconds, s.decode_seconds);
  }, loader);
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  const auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / (int64_t{1} << 30); };
  const auto rows = runtime::summarize_model_bench(names, samples, opts.bench);
  if (!opts.json) {
    fmt::print("{}", runtime::format_model_bench(rows, opts.bench));
    fmt::print("\n| model | load s | anonymous after load GiB | peak RSS GiB |\n|---|---|---|---|\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      fmt::print("| {} | {:.2f} [{:.2f}–{:.2f}] | {:.2f} | {:.2f} |\n", rows[i].name, median(memory[i].load_seconds),
                 *std::min_element(memory[i].load_seconds.begin(), memory[i].load_seconds.end()),
                 *std::max_element(memory[i].load_seconds.begin(), memory[i].load_seconds.end()),
                 gib(memory[i].anon_after_load), gib(memory[i].peak_rss));
    }
    return;
  }
  nlohmann::json out = {{"prompt_tokens", opts.bench.prompt_tokens},
                        {"gen_tokens", opts.bench.gen_tokens},
                        {"repetitions", opts.bench.repetitions},
                        {"warmup", opts.bench.warmup},
                        {"threads", opts.load.threads},
                        {"tensor_parallel_size", opts.load.parallel.tensor_parallel_size},
                        {"models", nlohmann::json::array()}};
  for (size_t i = 0; i < rows.size(); ++i) {
    nlohmann::json seconds = nlohmann::json::array();
    for (const auto& s : samples[i]) seconds.push_back({{"prefill", s.prefill_seconds}, {"decode", s.decode_seconds}});
    out["models"].push_back({{"model", rows[i].name},
                             {"prefill_tokens_per_s", rows[i].prefill_tokens_per_s},
                             {"decode_tokens_per_s", rows[i].decode_tokens_per_s},
                             {"tpot_ms", rows[i].tpot_ms},
                             {"prefill_vs_first", rows[i].prefill_vs_first},
                             {"decode_vs_first", rows[i].decode_vs_first},
                             {"load_seconds", memory[i].load_seconds},
                             {"anonymous_bytes_after_load", memory[i].anon_after_load},
                             {"peak_rss_bytes", memory[i].peak_rss},
                             {"seconds", seconds}});
  }
  fmt::print("{}\n", out.dump(2));
}

void register_bench_model(CLI::App& bench) {
  auto opts = std::make_shared<ModelBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "model", "Offline prefill/decode speed of one or more checkpoints, interleaved in one run (llama-bench style)");
  cmd->add_option("-m,--model", opts->models, "checkpoint folder (repeat to compare; ratios are vs the first)")
      ->required();
  add_parsed_option(*cmd, "--device", opts->load.device, parse_run_device,
                    "cpu, or cuda (run on the GPU found), or auto", "cpu");
  add_parsed_option(*cmd, "--activation-quant", opts->load.activation_quant, parse_activation_quant,
                    "auto, weight-only or emulate", "auto");
  add_parsed_list_option(*cmd, "--activation-precision", opts->activation_precisions, parse_activation_precision,
                         "auto, fp32, bf16, int8 and/or int8-decode (comma-separated: each model runs with each, "
                         "interleaved)",
                         "auto");
  add_parsed_list_option(*cmd, "--lm-head-dtype", opts->lm_head_dtypes, parse_lm_head_dtype,
                         "bf16, fp8 and/or int8 (comma-separated, as above)", "bf16");
  add_parsed_list_option(*cmd, "--kv-cache-dtype", opts->kv_cache_dtypes, parse_kv_cache_dtype,
                         "auto, fp32, bf16 and/or fp16 (comma-separated, as above)", "auto");
  add_parsed_list_option(*cmd, "--batch-invariant", opts->batch_invariant, parse_batch_invariant,
                         "off and/or on: the batch-invariant CPU kernels (comma-separated, as above)", "off");
  add_weight_cache_option(*cmd, opts->load.weight_cache);
  add_threads_option(*cmd, opts->load.threads);
  add_tensor_parallel_options(*cmd, opts->load.parallel);
  cmd->add_option("-p,--prompt-tokens", opts->bench.prompt_tokens, "prefill length")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("-n,--gen-tokens", opts->bench.gen_tokens, "decode steps (≥ 2)")->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  cmd->add_option("-r,--repetitions", opts->bench.repetitions, "rounds over all models")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--seed", opts->bench.seed, "prompt token-id seed")->capture_default_str();
  cmd->add_flag("!--no-warmup", opts->bench.warmup,
                "skip the untimed warmup (a prompt of up to 32 tokens and one output token) before each sample");
  cmd->add_flag("--json", opts->json, "print JSON (with every repetition's seconds)");
  cmd->callback([opts] {
    run_bench_model(*opts);
  });
}

}  // namespace

void register_bench(CLI::App& root) {
  CLI::App* bench = root.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto cfg = std::make_shared<server::BenchConfig>();
  auto as_json = std::make_shared<bool>(false);
  auto vocab = std::make_shared<int64_t>(0);
  register_bench_model(*bench);
  CLI::App* cmd = bench->add_subcommand("serve", "Load-test a server: random prompts, streamed completions, vllm-style report");
  cmd->add_option("--base-url", cfg->base_url, "server URL (http://host:port)")->capture_default_str();
  cmd->add_option("--model", cfg->model, "model id (default: the first /v1/models lists)");
  cmd->add_option("--api-key", cfg->api_key, "sent as 'Authorization: Bearer KEY'");
  cmd->add_option("--num-prompts", cfg->num_prompts, "requests to send")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-concurrency", cfg->max_concurrency, "requests in flight at most")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--input-len", cfg->input_len, "prompt tokens per request (exact: sent as token ids)")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--output-len", cfg->output_len, "generated tokens per request (exact: ignore_eos)")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--seed", cfg->seed, "prompt RNG seed")->capture_default_str();
  cmd->add_option("--vocab-size", *vocab, "draw ids from [0, N) (default: /v1/models vocab_size)");
  cmd->add_option("--timeout", cfg->timeout_seconds, "per-request timeout in seconds")->capture_default_str()->check(CLI::Range(1, 86400));
  auto extra = std::make_shared<std::string>();
  cmd->add_option("--extra-body", *extra,
                  "a JSON object merged into every request (vllm bench serve's flag), e.g. "
                  "'{\"structured_outputs\": {\"json\": {...}}}' to measure constrained decoding");
  cmd->add_flag("--json", *as_json, "print the report as JSON");
  cmd->callback([cfg, as_json, vocab, extra] {
    if (!extra->empty()) {
      const nlohmann::json body = nlohmann::json::parse(*extra, nullptr, false);
      if (!body.is_object()) throw UsageError(fmt::format("--extra-body must be a JSON object, got '{}'", *extra));
      cfg->extra_body = body;
    }
    if (*vocab > 0) cfg->vocab_size = *vocab;
    const server::BenchReport report = server::run_bench_serve(*cfg);
    if (*as_json) {
      fmt::print("{}\n", server::report_json(report).dump(2));
    } else {
      fmt::print("{}", server::format_report(report));
    }
  });
}

}  // namespace fp4serve::app
