// SPDX-License-Identifier: Apache-2.0
#include "server/bench_client.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "fp4serve/error.h"
#include "server/sse.h"

namespace fp4serve::server {
namespace {

using nlohmann::json;
using BenchClock = std::chrono::steady_clock;

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

httplib::Headers auth_headers(const BenchConfig& config) {
  httplib::Headers h;
  if (!config.api_key.empty()) h.emplace("Authorization", "Bearer " + config.api_key);
  return h;
}

void configure(httplib::Client& cli, const BenchConfig& config) {
  cli.set_connection_timeout(config.timeout_seconds);
  cli.set_read_timeout(config.timeout_seconds);
  cli.set_write_timeout(config.timeout_seconds);
  cli.set_keep_alive(true);
}

RequestRecord send_one(httplib::Client& cli, const BenchConfig& config, const std::string& model,
                       const std::vector<int32_t>& prompt) {
  RequestRecord rec;
  rec.prompt_len = static_cast<int64_t>(prompt.size());
  json body = {{"model", model},         {"prompt", prompt},      {"max_tokens", config.output_len},
               {"temperature", 0.0},     {"ignore_eos", true},    {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  for (const auto& [key, value] : config.extra_body.items()) body[key] = value;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = auth_headers(config);
  req.headers.emplace("Content-Type", "application/json");
  req.body = body.dump();
  int status = 0;
  bool done = false;
  std::string raw;  // kept for the error message when the answer is not a stream
  SseParser parser;
  BenchClock::time_point last{};
  const auto t0 = BenchClock::now();
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    const auto now = BenchClock::now();
    if (status != 200) {
      raw.append(data, std::min<size_t>(len, 4096));
      return true;
    }
    for (const std::string& event : parser.push(std::string_view(data, len))) {
      if (event == "[DONE]") {
        done = true;
        continue;
      }
      const json chunk = json::parse(event, nullptr, false);
      if (chunk.is_discarded() || !chunk.is_object()) {
        rec.error = "unparsable stream chunk";
        return false;
      }
      if (chunk.contains("error")) {
        rec.error = chunk["error"].value("message", "error event");
        return false;
      }
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        rec.output_tokens = chunk["usage"].value("completion_tokens", int64_t{0});
      }
      const auto& choices = chunk.value("choices", json::array());
      if (choices.empty() || !choices[0].is_object()) continue;
      const std::string text = choices[0].value("text", std::string());
      if (text.empty()) continue;
      if (last == BenchClock::time_point{}) {
        rec.ttft = std::chrono::duration<double>(now - t0).count();
      } else {
        rec.itl.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
    }
    return true;
  };
  const httplib::Result res = cli.send(req);
  rec.latency = std::chrono::duration<double>(BenchClock::now() - t0).count();
  if (!res) {
    if (rec.error.empty()) rec.error = fmt::format("HTTP error: {}", httplib::to_string(res.error()));
  } else if (status != 200) {
    rec.error = fmt::format("HTTP {}: {}", status, raw.empty() ? res->body : raw);
  } else if (!done && rec.error.empty()) {
    rec.error = "the stream ended without data: [DONE]";
  }
  rec.success = rec.error.empty();
  return rec;
}

}  // namespace

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double pos = q / 100.0 * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
}

BenchReport summarize(const std::vector<RequestRecord>& records, double duration_s, int max_concurrency) {
  BenchReport r;
  r.max_concurrency = max_concurrency;
  r.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl;
  for (const auto& rec : records) {
    if (!rec.success) {
      ++r.failed;
      if (r.errors.size() < 5) r.errors.push_back(rec.error);
      continue;
    }
    ++r.completed;
    r.total_input += rec.prompt_len;
    r.total_output += rec.output_tokens;
    ttft.push_back(rec.ttft * 1e3);
    if (rec.output_tokens > 1) tpot.push_back((rec.latency - rec.ttft) * 1e3 / static_cast<double>(rec.output_tokens - 1));
    for (const double x : rec.itl) itl.push_back(x * 1e3);
  }
  if (duration_s > 0) {
    r.request_throughput = r.completed / duration_s;
    r.output_throughput = static_cast<double>(r.total_output) / duration_s;
    r.total_token_throughput = static_cast<double>(r.total_input + r.total_output) / duration_s;
  }
  r.mean_ttft_ms = mean(ttft);
  r.median_ttft_ms = percentile(ttft, 50);
  r.p99_ttft_ms = percentile(ttft, 99);
  r.mean_tpot_ms = mean(tpot);
  r.median_tpot_ms = percentile(tpot, 50);
  r.p99_tpot_ms = percentile(tpot, 99);
  r.mean_itl_ms = mean(itl);
  r.median_itl_ms = percentile(itl, 50);
  r.p99_itl_ms = percentile(itl, 99);
  return r;
}

BenchReport run_bench_serve(const BenchConfig& config) {
  if (config.num_prompts <= 0 || config.max_concurrency <= 0 || config.input_len <= 0 || config.output_len <= 0) {
    throw UsageError(fmt::format("bench serve: --num-prompts ({}), --max-concurrency ({}), --input-len ({}) and "
                                 "--output-len ({}) must be > 0",
                                 config.num_prompts, config.max_concurrency, config.input_len, config.output_len));
  }
  if (config.base_url.rfind("http://", 0) != 0) {
    throw UsageError(fmt::format("bench serve: --base-url must start with http://, got '{}'", config.base_url));
  }
  httplib::Client probe(config.base_url);
  configure(probe, config);
  const auto models = probe.Get("/v1/models", auth_headers(config));
  if (!models || models->status != 200) {
    throw IoError(fmt::format("bench serve: GET {}/v1/models failed: {}", config.base_url,
                              models ? fmt::format("HTTP {} {}", models->status, models->body)
                                     : httplib::to_string(models.error())));
  }
  const json listing = json::parse(models->body, nullptr, false);
  if (listing.is_discarded() || !listing.contains("data") || !listing["data"].is_array() || listing["data"].empty()) {
    throw IoError(fmt::format("bench serve: {}/v1/models lists no model", config.base_url));
  }
  const json& first = listing["data"][0];
  const std::string model = config.model.empty() ? first.value("id", std::string()) : config.model;
  const int64_t vocab = config.vocab_size.value_or(first.value("vocab_size", int64_t{0}));
  if (vocab <= 0) throw UsageError("bench serve: the server does not report vocab_size; pass --vocab-size");

  // Random token ids, as vllm's random dataset: prompts of exactly input_len tokens whatever the tokenizer.
  std::mt19937_64 rng(config.seed);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(config.num_prompts));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(config.input_len));
    for (auto& id : p) id = static_cast<int32_t>(pick(rng));
  }

  std::vector<RequestRecord> records(prompts.size());
  std::atomic<size_t> next{0};
  const auto t0 = BenchClock::now();
  std::vector<std::thread> workers;
  const int n_workers = std::min(config.max_concurrency, config.num_prompts);
  for (int w = 0; w < n_workers; ++w) {
    workers.emplace_back([&] {
      httplib::Client cli(config.base_url);
      configure(cli, config);
      for (size_t i = next++; i < prompts.size(); i = next++) records[i] = send_one(cli, config, model, prompts[i]);
    });
  }
  for (auto& t : workers) t.join();
  const double duration = std::chrono::duration<double>(BenchClock::now() - t0).count();
  return summarize(records, duration, config.max_concurrency);
}

std::string format_report(const BenchReport& r) {
  std::string out;
  auto line = [&](const char* name, const std::string& value) { out += fmt::format("{:<40}{:<10}\n", name, value); };
  auto f2 = [](double x) { return fmt::format("{:.2f}", x); };
  out += fmt::format("{:=^50}\n", " Serving Benchmark Result ");
  line("Successful requests:", std::to_string(r.completed));
  line("Failed requests:", std::to_string(r.failed));
  line("Maximum request concurrency:", std::to_string(r.max_concurrency));
  line("Benchmark duration (s):", f2(r.duration_s));
  line("Total input tokens:", std::to_string(r.total_input));
  line("Total generated tokens:", std::to_string(r.total_output));
  line("Request throughput (req/s):", f2(r.request_throughput));
  line("Output token throughput (tok/s):", f2(r.output_throughput));
  line("Total Token throughput (tok/s):", f2(r.total_token_throughput));
  out += fmt::format("{:-^50}\n", "Time to First Token");
  line("Mean TTFT (ms):", f2(r.mean_ttft_ms));
  line("Median TTFT (ms):", f2(r.median_ttft_ms));
  line("P99 TTFT (ms):", f2(r.p99_ttft_ms));
  out += fmt::format("{:-^50}\n", "Time per Output Token (excl. 1st token)");
  line("Mean TPOT (ms):", f2(r.mean_tpot_ms));
  line("Median TPOT (ms):", f2(r.median_tpot_ms));
  line("P99 TPOT (ms):", f2(r.p99_tpot_ms));
  out += fmt::format("{:-^50}\n", "Inter-token Latency");
  line("Mean ITL (ms):", f2(r.mean_itl_ms));
  line("Median ITL (ms):", f2(r.median_itl_ms));
  line("P99 ITL (ms):", f2(r.p99_itl_ms));
  out += fmt::format("{:=^50}\n", "");
  for (const auto& e : r.errors) out += fmt::format("error: {}\n", e);
  return out;
}

nlohmann::json report_json(const BenchReport& r) {
  return {{"completed", r.completed},
          {"failed", r.failed},
          {"max_concurrency", r.max_concurrency},
          {"duration", r.duration_s},
          {"total_input_tokens", r.total_input},
          {"total_output_tokens", r.total_output},
          {"request_throughput", r.request_throughput},
          {"output_throughput", r.output_throughput},
          {"total_token_throughput", r.total_token_throughput},
          {"mean_ttft_ms", r.mean_ttft_ms},
          {"median_ttft_ms", r.median_ttft_ms},
          {"p99_ttft_ms", r.p99_ttft_ms},
          {"mean_tpot_ms", r.mean_tpot_ms},
          {"median_tpot_ms", r.median_tpot_ms},
          {"p99_tpot_ms", r.p99_tpot_ms},
          {"mean_itl_ms", r.mean_itl_ms},
          {"median_itl_ms", r.median_itl_ms},
          {"p99_itl_ms", r.p99_itl_ms},
          {"errors", r.errors}};
}

}  // namespace fp4serve::server
