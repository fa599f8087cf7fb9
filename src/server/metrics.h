// SPDX-License-Identifier: Apache-2.0
// Server metrics in the Prometheus text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/). Names follow vLLM's where one exists
// (time_to_first_token_seconds, inter_token_latency_seconds, num_requests_running …) with an `fp4serve_` prefix.
// Thread-safe: handlers and the scheduler record, /metrics renders.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace fp4serve::server {

/// A cumulative histogram: bucket i counts observations ≤ upper_bounds[i]; +Inf is implicit.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  /// `name`_bucket{`labels`,le=…}, `name`_sum{`labels`} and `name`_count{`labels`} lines; `labels` is
  /// `key="value"` pairs joined by commas (may be empty).
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the +Inf bucket last
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

/// One finished request's phases (seconds) and token counts, as vLLM's per-request histograms.
struct RequestTimes {
  double prefill = 0.0;    ///< admitted to the batch → first token
  double decode = 0.0;     ///< first token → end
  double inference = 0.0;  ///< admitted → end
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
};

class Metrics {
 public:
  Metrics();

  /// The `model_name` label every series carries (the served model name).
  void set_model_name(std::string name);
  /// One HTTP response with `status` (200, 400, 401, 429 …) on any endpoint but /metrics and /health.
  void count_request(int status);
  /// One finished sequence and why ("stop", "length", "abort", "error").
  void count_finished(const std::string& reason);
  void add_prompt_tokens(int64_t n);
  void add_generation_tokens(int64_t n);
  /// Prompt positions the model computed on admission: a prompt's tokens less those taken from the prefix cache
  /// or, for the choices of an n > 1 request, from another choice (recomputation after preemption not counted).
  void add_prompt_tokens_computed(int64_t n);
  void observe_ttft(double seconds);
  void observe_inter_token(double seconds);
  void observe_e2e(double seconds);
  /// Arrival → admission to the running batch.
  void observe_queue_time(double seconds);
  /// Tokens (decodes + prompt chunks) one forward step ran.
  void observe_iteration_tokens(int64_t tokens);
  void observe_request(const RequestTimes& times);
  /// Scheduler state after each step: sequences in the running batch, waiting in the queue, KV-cache slots
  /// in use out of the total, and positions held in them.
  void set_scheduler_state(int running, int waiting, int slots_used, int slots_total, int64_t cached_tokens);
  /// The paged KV cache after each step: blocks referenced by sequences out of the pool, prefix-cache tokens
  /// queried and hit (vLLM's prefix_cache_queries / prefix_cache_hits) and preemptions since start.
  void set_kv_state(int64_t blocks_used, int64_t blocks_total, int64_t prefix_queries, int64_t prefix_hits,
                    int64_t preemptions);
  /// The queue length as soon as it changes on submit (the scheduler may be inside a long step).
  void set_waiting(int waiting);

  std::string render() const;

  // Read back for tests and logs.
  int running() const;
  int waiting() const;
  int slots_used() const;
  uint64_t finished(const std::string& reason) const;

 private:
  mutable std::mutex mutex_;
  std::map<int, uint64_t> requests_by_status_;
  std::map<std::string, uint64_t> finished_by_reason_;
  uint64_t prompt_tokens_ = 0;
  uint64_t prompt_tokens_computed_ = 0;
  uint64_t generation_tokens_ = 0;
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  Histogram queue_, prefill_, decode_, inference_;
  Histogram prompt_hist_, generation_hist_, iteration_;
  std::string labels_ = "model_name=\"\"";
  int running_ = 0;
  int waiting_ = 0;
  int slots_used_ = 0;
  int slots_total_ = 0;
  int64_t cached_tokens_ = 0;
  int64_t blocks_used_ = 0, blocks_total_ = 0, prefix_queries_ = 0, prefix_hits_ = 0, preemptions_ = 0;
};

}  // namespace fp4serve::server
