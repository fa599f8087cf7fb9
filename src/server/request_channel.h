// SPDX-License-Identifier: Apache-2.0
// The only thing HTTP handler threads and the scheduler thread share for one request: the scheduler pushes
// generated ids and the end of the sequence, the handler waits for them and may cancel (client gone, stop
// string matched). Handlers never touch the model.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/structured_output.h"

namespace fp4serve::server {

using Clock = std::chrono::steady_clock;

class RequestChannel;

/// A tokenized, validated request as the scheduler runs it.
struct SequenceRequest {
  std::vector<int32_t> prompt;          ///< non-empty; prompt + max_new_tokens ≤ the model's context
  runtime::SamplingParams sampling;
  int64_t max_new_tokens = 16;          ///< ≥ 1
  std::vector<int32_t> eos_token_ids;   ///< sampled EOS ends the sequence (not emitted) unless ignore_eos
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;  ///< sampled, one of these ends the sequence (not emitted), ignore_eos or not
  int top_logprobs = -1;                ///< ≥ 0: each token comes with its logprob and this many alternatives
  /// Constrained decoding: each token is sampled from the tokens this grammar allows next; the sequence ends
  /// (kStop) when the grammar accepts a stop token, which is not emitted. Null: unconstrained.
  std::shared_ptr<const runtime::CompiledGrammar> grammar;
  /// ≥ 0: the grammar applies only after this token has been generated (a reasoning model's </think>: the
  /// reasoning is free, the answer constrained, as vLLM applies structured outputs after the reasoning ends).
  int32_t grammar_after_token = -1;
  Clock::time_point arrival = Clock::now();  ///< when the HTTP request arrived (TTFT is measured from here)
  /// Non-zero for the choices of one request with n > 1 (Scheduler::submit_n sets it): the scheduler computes
  /// their shared prompt once.
  uint64_t choice_group = 0;
};

enum class FinishReason {
  kStop,    ///< EOS sampled (or, decided by the handler, a stop string)
  kLength,  ///< max_new_tokens reached
  kAbort,   ///< cancelled by the handler: client disconnected or stop string matched
  kError,   ///< the forward step failed or the server is shutting down
};

/// OpenAI's finish_reason string ("stop", "length"; "abort" and "error" are vLLM's extensions).
const char* finish_reason_name(FinishReason reason);

/// What a handler receives from one wait: the ids generated since the previous wait and, once the sequence
/// has ended, why.
struct ChannelUpdate {
  std::vector<int32_t> tokens;
  std::vector<runtime::TokenLogprobs> logprobs;  ///< one per token when the request asked for logprobs
  bool finished = false;
  FinishReason reason = FinishReason::kStop;
  std::string error;  ///< set with kError
};

class RequestChannel {
 public:
  explicit RequestChannel(SequenceRequest request) : request_(std::move(request)) {}

  const SequenceRequest& request() const { return request_; }

  // Scheduler side.
  void push_token(int32_t token, runtime::TokenLogprobs* logprobs = nullptr);
  /// Ends the sequence; later calls are ignored, so the first reason wins.
  void finish(FinishReason reason, std::string error = {});

  // Handler side.
  /// Blocks until new ids or the end arrive, or `timeout` passes (then the update is empty and unfinished).
  ChannelUpdate wait(std::chrono::milliseconds timeout);
  /// Asks the scheduler to drop the sequence at its next step (frees the KV-cache slot); `reason` is what the
  /// scheduler records: kAbort for a client that is gone, kStop for a stop string the handler matched.
  void cancel(FinishReason reason = FinishReason::kAbort) {
    cancel_reason_.store(reason, std::memory_order_relaxed);
    cancelled_.store(true, std::memory_order_release);
  }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  /// Prompt tokens the scheduler found in the prefix cache when it first admitted the request (usage's
  /// prompt_tokens_details.cached_tokens); set before the first token is pushed.
  void set_cached_tokens(int64_t n) { cached_tokens_.store(n, std::memory_order_release); }
  int64_t cached_tokens() const { return cached_tokens_.load(std::memory_order_acquire); }
  FinishReason cancel_reason() const { return cancel_reason_.load(std::memory_order_relaxed); }

 private:
  const SequenceRequest request_;
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> cached_tokens_{0};
  std::atomic<FinishReason> cancel_reason_{FinishReason::kAbort};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<int32_t> pending_;
  std::vector<runtime::TokenLogprobs> pending_logprobs_;
  bool finished_ = false;
  FinishReason reason_ = FinishReason::kStop;
  std::string error_;
};

}  // namespace fp4serve::server
