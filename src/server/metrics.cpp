// SPDX-License-Identifier: Apache-2.0
#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace fp4serve::server {
namespace {

// Bucket bounds as vLLM's (seconds): TTFT spans queueing under load, ITL spans one decode step.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                                         0.5,  0.75,  1.0,  2.5,   5.0, 7.5,  10.0, 20.0};
const std::vector<double> kE2eBuckets = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0};

// Prometheus floats: shortest round-trip form, +Inf spelled as the format requires.
std::string number(double v) { return fmt::format("{}", v); }

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);  // first bound ≥ value: le semantics
  ++counts_[static_cast<size_t>(it - bounds_.begin())];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, number(bounds_[i]), cumulative);
  }
  cumulative += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cumulative);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, number(sum_), name, count_);
}

Metrics::Metrics() : ttft_(kTtftBuckets), itl_(kItlBuckets), e2e_(kE2eBuckets) {}

void Metrics::count_request(int status) {
  std::lock_guard lock(mutex_);
  ++requests_by_status_[status];
}

void Metrics::count_finished(const std::string& reason) {
  std::lock_guard lock(mutex_);
  ++finished_by_reason_[reason];
}

void Metrics::add_prompt_tokens(int64_t n) {
  std::lock_guard lock(mutex_);
  prompt_tokens_ += static_cast<uint64_t>(n);
}

void Metrics::add_generation_tokens(int64_t n) {
  std::lock_guard lock(mutex_);
  generation_tokens_ += static_cast<uint64_t>(n);
}

void Metrics::observe_ttft(double seconds) {
  std::lock_guard lock(mutex_);
  ttft_.observe(seconds);
}

void Metrics::observe_inter_token(double seconds) {
  std::lock_guard lock(mutex_);
  itl_.observe(seconds);
}

void Metrics::observe_e2e(double seconds) {
  std::lock_guard lock(mutex_);
  e2e_.observe(seconds);
}

void Metrics::set_scheduler_state(int running, int waiting, int slots_used, int slots_total, int64_t cached_tokens) {
  std::lock_guard lock(mutex_);
  running_ = running;
  waiting_ = waiting;
  slots_used_ = slots_used;
  slots_total_ = slots_total;
  cached_tokens_ = cached_tokens;
}

void Metrics::set_waiting(int waiting) {
  std::lock_guard lock(mutex_);
  waiting_ = waiting;
}

int Metrics::running() const {
  std::lock_guard lock(mutex_);
  return running_;
}

int Metrics::waiting() const {
  std::lock_guard lock(mutex_);
  return waiting_;
}

int Metrics::slots_used() const {
  std::lock_guard lock(mutex_);
  return slots_used_;
}

uint64_t Metrics::finished(const std::string& reason) const {
  std::lock_guard lock(mutex_);
  const auto it = finished_by_reason_.find(reason);
  return it == finished_by_reason_.end() ? 0 : it->second;
}

std::string Metrics::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  header(out, "fp4serve_requests_total", "counter", "HTTP requests to the API endpoints by response status.");
  for (const auto& [status, n] : requests_by_status_) {
    out += fmt::format("fp4serve_requests_total{{status=\"{}\"}} {}\n", status, n);
  }
  header(out, "fp4serve_request_success_total", "counter", "Finished sequences by finish reason.");
  for (const auto& [reason, n] : finished_by_reason_) {
    out += fmt::format("fp4serve_request_success_total{{finished_reason=\"{}\"}} {}\n", reason, n);
  }
  header(out, "fp4serve_prompt_tokens_total", "counter", "Prompt tokens admitted to the batch.");
  out += fmt::format("fp4serve_prompt_tokens_total {}\n", prompt_tokens_);
  header(out, "fp4serve_generation_tokens_total", "counter", "Generated tokens.");
  out += fmt::format("fp4serve_generation_tokens_total {}\n", generation_tokens_);
  header(out, "fp4serve_time_to_first_token_seconds", "histogram",
         "From request arrival to the first generated token.");
  ttft_.render(out, "fp4serve_time_to_first_token_seconds");
  header(out, "fp4serve_inter_token_latency_seconds", "histogram", "Between consecutive tokens of a sequence.");
  itl_.render(out, "fp4serve_inter_token_latency_seconds");
  header(out, "fp4serve_e2e_request_latency_seconds", "histogram", "From request arrival to the end of generation.");
  e2e_.render(out, "fp4serve_e2e_request_latency_seconds");
  header(out, "fp4serve_num_requests_running", "gauge", "Sequences in the running batch.");
  out += fmt::format("fp4serve_num_requests_running {}\n", running_);
  header(out, "fp4serve_num_requests_waiting", "gauge", "Requests queued for admission.");
  out += fmt::format("fp4serve_num_requests_waiting {}\n", waiting_);
  header(out, "fp4serve_kv_cache_usage_perc", "gauge",
         "Fraction of KV-cache slots in use (each slot reserves max-model-len positions).");
  out += fmt::format("fp4serve_kv_cache_usage_perc {}\n",
                     number(slots_total_ > 0 ? static_cast<double>(slots_used_) / slots_total_ : 0.0));
  header(out, "fp4serve_kv_cache_slots_used", "gauge", "KV-cache slots held by running sequences.");
  out += fmt::format("fp4serve_kv_cache_slots_used {}\n", slots_used_);
  header(out, "fp4serve_kv_cache_slots_total", "gauge", "KV-cache slots the memory budget allows.");
  out += fmt::format("fp4serve_kv_cache_slots_total {}\n", slots_total_);
  header(out, "fp4serve_kv_cache_tokens", "gauge", "Positions filled in the KV-cache slots in use.");
  out += fmt::format("fp4serve_kv_cache_tokens {}\n", cached_tokens_);
  return out;
}

}  // namespace fp4serve::server
