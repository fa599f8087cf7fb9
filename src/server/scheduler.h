// SPDX-License-Identifier: Apache-2.0
// Continuous batching over a paged KV cache (vLLM V1's policy). One thread owns the model; requests wait in a
// bounded queue and join the running batch between steps while the block pool has blocks for their first chunk
// (after the prefix cache supplied what it holds of their prompt). Every step runs all running sequences through
// one forward: each decoding sequence contributes its last token, and prompts are prefilled in chunks that fill
// the rest of a per-step token budget, so a long prompt never stalls the sequences that are streaming. When a
// running sequence cannot get a block, the most recently admitted sequence is preempted: its blocks are freed
// (its full ones stay in the prefix cache), and it waits ahead of the queue to be recomputed from its prompt and
// the tokens it generated so far; no new request is admitted in a step that preempted. A cancelled sequence
// (client gone) is dropped and its blocks freed at the next step.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/structured_output.h"
#include "server/metrics.h"
#include "server/request_channel.h"
#include "server/step_model.h"

namespace fp4serve::server {

struct SchedulerConfig {
  int max_num_seqs = 16;                 ///< sequences in the running batch (also bounded by the cache's slots)
  int64_t max_num_batched_tokens = 256;  ///< tokens per step: decodes first, prefill chunks fill the rest
  int max_queue = 64;                    ///< waiting requests before submit() refuses (HTTP 429)
};

class Scheduler {
 public:
  /// Throws UsageError on non-positive sizes. Does not start the thread.
  Scheduler(StepModel& model, const SchedulerConfig& config, Metrics& metrics);
  /// Stops the thread; unfinished requests end with FinishReason::kError.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  void start();
  /// Ends the scheduler thread after the current step and fails every unfinished request ("shutting down").
  /// Idempotent.
  void stop();

  /// Queues `request` (prompt non-empty, prompt + max_new_tokens ≤ context: the caller validates). Returns
  /// nullptr when the queue is full or the scheduler is stopped.
  std::shared_ptr<RequestChannel> submit(SequenceRequest request);
  /// n choices of one request (OpenAI's `n`): `n` channels queued together, each its own sequence. Choice i > 0
  /// samples with seed + i (vLLM's child requests), so seeded choices differ and greedy ones are identical; a choice
  /// admitted after another computed the prompt's full blocks reuses them (prefix caching). Empty when the queue
  /// has no room for all n or the scheduler is stopped. Throws UsageError when n < 1 or n exceeds the running batch
  /// (max_num_seqs and the model's slots).
  std::vector<std::shared_ptr<RequestChannel>> submit_n(SequenceRequest request, int n);
  /// The most sequences that run at once (max_num_seqs capped by the model's slots): the bound on n.
  int max_running() const;

  int64_t context_length() const { return model_.max_seq_len(); }

 private:
  struct Sequence {
    std::shared_ptr<RequestChannel> channel;
    int slot = -1;
    std::vector<int32_t> tokens;  // prompt, then generated ids
    int64_t prompt_len = 0;
    int64_t computed = 0;         // positions already in the KV cache
    int64_t generated = 0;
    int64_t take = 0;             // tokens this step runs
    bool done = false;            // finished: its channel is closed, its blocks freed
    std::optional<runtime::Sampler> sampler;
    std::optional<runtime::GrammarMatcher> grammar;  // the request's grammar, when constrained
    bool grammar_waits = false;  // until the request's grammar_after_token is generated
    Clock::time_point last_token{};
    Clock::time_point admitted{}, first_token{};
  };

  // Samples the next token of `seq` from `row` (modified) and pushes it or ends the sequence.
  void emit(Sequence& seq, std::span<float> row, Clock::time_point now);

  void run();
  /// Admits waiting sequences (preempted ones first) while slots, blocks and the token budget last.
  void admit(int64_t& budget, bool& first_chunk);
  void drop_cancelled();
  void step();
  /// Frees `seq`'s blocks and puts it ahead of the queue (recomputed on resumption).
  void preempt(Sequence& seq);
  /// The step's share of `seq`: its unscheduled tokens, at most `budget` (at least one for the step's first chunk).
  static int64_t tokens_to_run(const Sequence& seq, int64_t budget, bool first_chunk);
  void finish(Sequence& seq, FinishReason reason, const std::string& error = {});
  void publish_state();

  StepModel& model_;
  const SchedulerConfig config_;
  Metrics& metrics_;

  std::mutex mutex_;  // guards queue_ and stopping_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<RequestChannel>> queue_;
  bool stopping_ = false;

  // Scheduler thread only.
  std::vector<Sequence> running_;
  std::deque<Sequence> preempted_;  // waiting to resume, ahead of queue_
  int64_t preemptions_ = 0;
  std::vector<float> logits_;
  std::vector<float> raw_row_;  // one row before sampling, for logprobs
  std::thread thread_;
};

}  // namespace fp4serve::server
