// SPDX-License-Identifier: Apache-2.0
// `fp4serve bench serve`: a load generator for an OpenAI-compatible server with the report fields of
// `vllm bench serve` (vllm/benchmarks/serve.py): random prompts of exact token lengths sent as token-id lists,
// streamed /v1/completions with ignore_eos so every request produces exactly output_len tokens, at most
// max_concurrency in flight.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace fp4serve::server {

struct BenchConfig {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;            ///< empty: the first model /v1/models lists
  std::string api_key;
  int num_prompts = 16;
  int max_concurrency = 1;
  int64_t input_len = 128;
  int64_t output_len = 128;
  uint64_t seed = 0;
  std::optional<int64_t> vocab_size;  ///< token ids are drawn from [0, vocab); default: /v1/models `vocab_size`
  int timeout_seconds = 600;    ///< per request (connect, read, write)
  /// Fields merged into every request body (vllm bench serve's --extra-body), e.g. a structured-output field.
  nlohmann::json extra_body = nlohmann::json::object();
};

/// One request as the client saw it.
struct RequestRecord {
  bool success = false;
  std::string error;
  int64_t prompt_len = 0;
  int64_t output_tokens = 0;    ///< usage.completion_tokens of the stream
  double ttft = 0.0;            ///< seconds from send to the first chunk with content
  double latency = 0.0;         ///< seconds from send to the end of the stream
  std::vector<double> itl;      ///< seconds between consecutive content chunks
};

/// The `vllm bench serve` summary. Times in milliseconds, percentiles as numpy.percentile (linear).
struct BenchReport {
  int completed = 0;
  int failed = 0;
  int max_concurrency = 0;
  double duration_s = 0.0;
  int64_t total_input = 0;
  int64_t total_output = 0;
  double request_throughput = 0.0;
  double output_throughput = 0.0;
  double total_token_throughput = 0.0;
  double mean_ttft_ms = 0, median_ttft_ms = 0, p99_ttft_ms = 0;
  double mean_tpot_ms = 0, median_tpot_ms = 0, p99_tpot_ms = 0;
  double mean_itl_ms = 0, median_itl_ms = 0, p99_itl_ms = 0;
  std::vector<std::string> errors;  ///< the first few failure messages
};

/// numpy.percentile(values, q) with linear interpolation; 0 for an empty list.
double percentile(std::vector<double> values, double q);

/// Aggregates records as vllm bench serve does: TPOT per request = (latency − ttft) / (output_tokens − 1) over
/// requests with more than one output token; ITL over every gap of every successful request.
BenchReport summarize(const std::vector<RequestRecord>& records, double duration_s, int max_concurrency);

/// Runs the benchmark. Throws IoError when the server cannot be reached for /v1/models, UsageError on bad
/// settings (non-positive counts or lengths, a URL without http://).
BenchReport run_bench_serve(const BenchConfig& config);

/// The report as vllm prints it.
std::string format_report(const BenchReport& report);
nlohmann::json report_json(const BenchReport& report);

}  // namespace fp4serve::server
