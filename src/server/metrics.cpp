// SPDX-License-Identifier: Apache-2.0
#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/memory_stats.h"

namespace fp4serve::server {
namespace {

// Bucket bounds as vLLM's (seconds): TTFT spans queueing under load, ITL spans one decode step.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                                         0.5,  0.75,  1.0,  2.5,   5.0, 7.5,  10.0, 20.0};
const std::vector<double> kE2eBuckets = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0};

const std::vector<double> kPhaseBuckets = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0};
// Token counts: vLLM's 1-2-5 series up to the context length.
const std::vector<double> kTokenBuckets = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};
const std::vector<double> kIterationBuckets = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};

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

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  const std::string sep = labels.empty() ? "" : ",";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, number(bounds_[i]), cumulative);
  }
  cumulative += counts_.back();
  out += fmt::format("{}_bucket{{{}{}le=\"+Inf\"}} {}\n", name, labels, sep, cumulative);
  out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, number(sum_), name, labels, count_);
}

Metrics::Metrics()
    : ttft_(kTtftBuckets), itl_(kItlBuckets), e2e_(kE2eBuckets), queue_(kE2eBuckets), prefill_(kPhaseBuckets),
      decode_(kPhaseBuckets), inference_(kPhaseBuckets), prompt_hist_(kTokenBuckets), generation_hist_(kTokenBuckets),
      iteration_(kIterationBuckets) {}

void Metrics::set_model_name(std::string name) {
  // Label values escape backslash, quote and newline (exposition format 0.0.4).
  std::string escaped;
  for (const char c : name) {
    if (c == '\\' || c == '"') escaped += '\\';
    if (c == '\n') {
      escaped += "\\n";
      continue;
    }
    escaped += c;
  }
  std::lock_guard lock(mutex_);
  labels_ = "model_name=\"" + escaped + "\"";
}

void Metrics::observe_queue_time(double seconds) {
  std::lock_guard lock(mutex_);
  queue_.observe(seconds);
}

void Metrics::observe_iteration_tokens(int64_t tokens) {
  std::lock_guard lock(mutex_);
  iteration_.observe(static_cast<double>(tokens));
}

void Metrics::observe_request(const RequestTimes& t) {
  std::lock_guard lock(mutex_);
  prefill_.observe(t.prefill);
  decode_.observe(t.decode);
  inference_.observe(t.inference);
  prompt_hist_.observe(static_cast<double>(t.prompt_tokens));
  generation_hist_.observe(static_cast<double>(t.generation_tokens));
}

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

void Metrics::add_prompt_tokens_computed(int64_t n) {
  std::lock_guard lock(mutex_);
  prompt_tokens_computed_ += static_cast<uint64_t>(n);
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

void Metrics::set_kv_state(int64_t blocks_used, int64_t blocks_total, int64_t prefix_queries, int64_t prefix_hits,
                           int64_t preemptions) {
  std::lock_guard lock(mutex_);
  blocks_used_ = blocks_used;
  blocks_total_ = blocks_total;
  prefix_queries_ = prefix_queries;
  prefix_hits_ = prefix_hits;
  preemptions_ = preemptions;
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
  const std::string& l = labels_;
  auto value = [&](const char* name, auto v) { out += fmt::format("{}{{{}}} {}\n", name, l, v); };
  header(out, "fp4serve_requests_total", "counter", "HTTP requests to the API endpoints by response status.");
  for (const auto& [status, n] : requests_by_status_) {
    out += fmt::format("fp4serve_requests_total{{{},status=\"{}\"}} {}\n", l, status, n);
  }
  header(out, "fp4serve_request_success_total", "counter", "Finished sequences by finish reason.");
  for (const auto& [reason, n] : finished_by_reason_) {
    out += fmt::format("fp4serve_request_success_total{{{},finished_reason=\"{}\"}} {}\n", l, reason, n);
  }
  header(out, "fp4serve_prompt_tokens_total", "counter", "Prompt tokens admitted to the batch.");
  value("fp4serve_prompt_tokens_total", prompt_tokens_);
  header(out, "fp4serve_prompt_tokens_computed_total", "counter",
         "Prompt tokens the model computed on admission (not taken from the prefix cache or another choice of an n > 1 "
         "request).");
  value("fp4serve_prompt_tokens_computed_total", prompt_tokens_computed_);
  header(out, "fp4serve_generation_tokens_total", "counter", "Generated tokens.");
  value("fp4serve_generation_tokens_total", generation_tokens_);
  header(out, "fp4serve_num_preemptions_total", "counter",
         "Sequences preempted (their KV blocks freed, recomputed on resumption) when the block pool ran dry.");
  value("fp4serve_num_preemptions_total", preemptions_);
  header(out, "fp4serve_prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache on admission.");
  value("fp4serve_prefix_cache_queries_total", prefix_queries_);
  header(out, "fp4serve_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache on admission.");
  value("fp4serve_prefix_cache_hits_total", prefix_hits_);
  struct Named {
    const char* name;
    const char* help;
    const Histogram& h;
  };
  for (const Named& n : {
           Named{"fp4serve_time_to_first_token_seconds", "From request arrival to the first generated token.", ttft_},
           Named{"fp4serve_inter_token_latency_seconds", "Between consecutive tokens of a sequence.", itl_},
           Named{"fp4serve_e2e_request_latency_seconds", "From request arrival to the end of generation.", e2e_},
           Named{"fp4serve_request_queue_time_seconds", "From request arrival to admission to the batch.", queue_},
           Named{"fp4serve_request_prefill_time_seconds", "From admission to the first generated token.", prefill_},
           Named{"fp4serve_request_decode_time_seconds", "From the first generated token to the end.", decode_},
           Named{"fp4serve_request_inference_time_seconds", "From admission to the end of generation.", inference_},
           Named{"fp4serve_request_prompt_tokens", "Prompt tokens per finished request.", prompt_hist_},
           Named{"fp4serve_request_generation_tokens", "Generated tokens per finished request.", generation_hist_},
           Named{"fp4serve_iteration_tokens_total", "Tokens per forward step (decodes and prompt chunks).", iteration_},
       }) {
    header(out, n.name, "histogram", n.help);
    n.h.render(out, n.name, l);
  }
  header(out, "fp4serve_num_requests_running", "gauge", "Sequences in the running batch.");
  value("fp4serve_num_requests_running", running_);
  header(out, "fp4serve_num_requests_waiting", "gauge", "Requests queued for admission.");
  value("fp4serve_num_requests_waiting", waiting_);
  header(out, "fp4serve_kv_cache_usage_perc", "gauge",
         "Fraction of KV-cache blocks held by running sequences (of slots before the first step).");
  const double usage = blocks_total_ > 0 ? static_cast<double>(blocks_used_) / static_cast<double>(blocks_total_)
                       : slots_total_ > 0 ? static_cast<double>(slots_used_) / slots_total_
                                          : 0.0;
  value("fp4serve_kv_cache_usage_perc", number(usage));
  header(out, "fp4serve_kv_cache_blocks_used", "gauge", "KV-cache blocks referenced by running sequences.");
  value("fp4serve_kv_cache_blocks_used", blocks_used_);
  header(out, "fp4serve_kv_cache_blocks_total", "gauge", "KV-cache blocks in the pool (--kv-cache-memory).");
  value("fp4serve_kv_cache_blocks_total", blocks_total_);
  header(out, "fp4serve_kv_cache_slots_used", "gauge", "Sequences holding KV-cache blocks.");
  value("fp4serve_kv_cache_slots_used", slots_used_);
  header(out, "fp4serve_kv_cache_slots_total", "gauge", "Sequences the KV cache may hold at once (--max-num-seqs).");
  value("fp4serve_kv_cache_slots_total", slots_total_);
  header(out, "fp4serve_kv_cache_tokens", "gauge", "Positions filled in the KV-cache slots in use.");
  value("fp4serve_kv_cache_tokens", cached_tokens_);
  // Read at each scrape: the process's memory now, and its peak since start (weights, KV pool and the load's
  // transients together).
  const core::ProcessMemory memory = core::process_memory();
  header(out, "fp4serve_process_resident_memory_bytes", "gauge", "Resident memory of the server process (VmRSS).");
  value("fp4serve_process_resident_memory_bytes", memory.rss);
  header(out, "fp4serve_process_peak_resident_memory_bytes", "gauge",
         "Peak resident memory of the server process since it started (VmHWM).");
  value("fp4serve_process_peak_resident_memory_bytes", memory.peak_rss);
  header(out, "fp4serve_process_anonymous_memory_bytes", "gauge",
         "Resident anonymous memory (RssAnon): the weights as loaded, the KV pool, buffers; not the mapped checkpoint.");
  value("fp4serve_process_anonymous_memory_bytes", memory.anon);
  return out;
}

}  // namespace fp4serve::server
