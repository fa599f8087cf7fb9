// SPDX-License-Identifier: Apache-2.0
// `fp4serve bench serve`: load generator against a running OpenAI-compatible server (src/server/bench_client.h),
// printing the same report as `vllm bench serve`, or JSON.
#include <fmt/format.h>

#include <cstdio>

#include "app/commands.h"
#include "server/bench_client.h"

namespace fp4serve::app {

void register_bench(CLI::App& root) {
  CLI::App* bench = root.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto cfg = std::make_shared<server::BenchConfig>();
  auto as_json = std::make_shared<bool>(false);
  auto vocab = std::make_shared<int64_t>(0);
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
  cmd->add_flag("--json", *as_json, "print the report as JSON");
  cmd->callback([cfg, as_json, vocab] {
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
