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
//
// n > 1 (parallel sampling) computes the prompt once. vLLM V1 fans the request out into n child requests and
// lets the prefix cache share the prompt; here the choices share it whether prefix caching is on or not: the
// first choice admitted (the leader) prefills the prompt, the others take a slot and wait ("parked", no blocks,
// no tokens) until a choice of their request holds the prompt's full blocks, then fork its block table
// (KvCache::fork: one more reference per block, nothing copied) and compute only the prompt's last partial
// block (1 … block_size tokens) for their own first logits. If the leader ends or is preempted before its
// prompt is computed, the first parked choice takes over as leader (with the prefix cache's blocks if any).
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
  /// samples with seed + i (vLLM's child requests), so seeded choices differ and greedy ones are identical; the
  /// prompt is computed once (see the top of this file) and each choice reports the positions it did not compute
  /// as cached_tokens. Empty when the queue has no room for all n or the scheduler is stopped. Throws UsageError
  /// when n < 1 or n exceeds the running batch (max_num_seqs and the model's slots).
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
    uint64_t group = 0;          // n > 1: the request's choice group (SequenceRequest::choice_group)
    bool parked = false;         // holds a slot and nothing else until a choice of its group holds the prompt
    bool holds_window = false;   // computes its group's prompt: its sliding-window blocks stay until the others fork
    Clock::time_point last_token{};
    Clock::time_point admitted{}, first_token{};
  };

  // Samples the next token of `seq` from `row` (modified) and pushes it or ends the sequence.
  void emit(Sequence& seq, std::span<float> row, Clock::time_point now);

  void run();
  /// Admits waiting sequences (preempted ones first) while slots, blocks and the token budget last.
  void admit(int64_t& budget, bool& first_chunk);
  void drop_cancelled();
  /// Parked choices of an n > 1 request: those whose group holds the prompt's full blocks fork them; those whose
  /// group no longer computes the prompt (its leader ended or was preempted) take over as leader.
  void unpark();
  /// A running choice of `seq`'s group whose cache holds `seq`'s prompt blocks (null when none), and whether a
  /// choice of the group is computing the prompt now.
  const Sequence* fork_donor(const Sequence& seq, bool& computing) const;
  /// Starts computing `seq`'s prompt on its (empty) slot with what the prefix cache holds of it.
  void lead(Sequence& seq);
  /// `seq` computes its group's prompt: keeps the sliding-window blocks that the other choices' first computed
  /// position reads (KvCache::hold_window) until none of them waits to fork (release_window_holds).
  void hold_for_choices(Sequence& seq);
  /// Lifts the holds of groups none of whose choices is parked or queued any more.
  void release_window_holds();
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
  uint64_t next_group_ = 1;  // under mutex_ (submit_n)
  std::vector<float> logits_;
  std::vector<float> raw_row_;  // one row before sampling, for logprobs
  std::thread thread_;
};

}  // namespace fp4serve::server
