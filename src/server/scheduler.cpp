// SPDX-License-Identifier: Apache-2.0
#include "server/scheduler.h"

#include "core/threading.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>

#include "fp4serve/error.h"

namespace fp4serve::server {
namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Scheduler::Scheduler(StepModel& model, const SchedulerConfig& config, Metrics& metrics)
    : model_(model), config_(config), metrics_(metrics) {
  if (config.max_num_seqs <= 0 || config.max_num_batched_tokens <= 0 || config.max_queue < 0) {
    throw UsageError(fmt::format("scheduler: max_num_seqs ({}) and max_num_batched_tokens ({}) must be > 0 and "
                                 "max_queue ({}) ≥ 0",
                                 config.max_num_seqs, config.max_num_batched_tokens, config.max_queue));
  }
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::start() {
  if (thread_.joinable()) return;
  publish_state();
  thread_ = std::thread([this] {
    core::adopt_engine_threads();  // --threads was set on the main thread; OpenMP counts are per thread
    run();
  });
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The thread is gone (or never ran): fail whatever is left so no handler waits forever.
  for (auto& seq : running_) finish(seq, FinishReason::kError, "the server is shutting down");
  running_.clear();
  std::deque<std::shared_ptr<RequestChannel>> left;
  {
    std::lock_guard lock(mutex_);
    left.swap(queue_);
  }
  for (auto& ch : left) ch->finish(FinishReason::kError, "the server is shutting down");
}

std::shared_ptr<RequestChannel> Scheduler::submit(SequenceRequest request) {
  auto channel = std::make_shared<RequestChannel>(std::move(request));
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || static_cast<int>(queue_.size()) >= config_.max_queue) return nullptr;
    queue_.push_back(channel);
    metrics_.set_waiting(static_cast<int>(queue_.size()));
  }
  cv_.notify_all();
  return channel;
}

void Scheduler::run() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || !running_.empty(); });
      if (stopping_) return;
    }
    drop_cancelled();
    admit();
    if (!running_.empty()) step();
    publish_state();
  }
}

void Scheduler::admit() {
  const int limit = std::min(config_.max_num_seqs, model_.max_slots());
  while (static_cast<int>(running_.size()) < limit) {
    std::shared_ptr<RequestChannel> channel;
    int slot = -1;
    {
      std::lock_guard lock(mutex_);
      if (queue_.empty()) return;
      if (!queue_.front()->cancelled()) {
        // The KV-cache budget decides admission: without a free slot the request keeps its place in the queue.
        slot = model_.acquire_slot();
        if (slot < 0) return;
      }
      channel = std::move(queue_.front());
      queue_.pop_front();
      metrics_.set_waiting(static_cast<int>(queue_.size()));
    }
    if (slot < 0) {
      channel->finish(channel->cancel_reason());
      metrics_.count_finished(finish_reason_name(channel->cancel_reason()));
      continue;
    }
    const SequenceRequest& req = channel->request();
    Sequence seq;
    seq.channel = std::move(channel);
    seq.slot = slot;
    seq.tokens.reserve(req.prompt.size() + static_cast<size_t>(req.max_new_tokens));
    seq.tokens = req.prompt;
    seq.prompt_len = static_cast<int64_t>(req.prompt.size());
    seq.sampler.emplace(req.sampling);
    seq.sampler->observe_prompt(req.prompt);
    seq.admitted = Clock::now();
    metrics_.add_prompt_tokens(seq.prompt_len);
    metrics_.observe_queue_time(seconds_between(req.arrival, seq.admitted));
    running_.push_back(std::move(seq));
  }
}

void Scheduler::drop_cancelled() {
  for (auto& seq : running_) {
    if (seq.channel->cancelled()) finish(seq, seq.channel->cancel_reason());
  }
  std::erase_if(running_, [](const Sequence& s) { return s.slot < 0; });
  // Cancelled requests still queued give their place back now rather than when they reach the front.
  std::vector<std::shared_ptr<RequestChannel>> gone;
  {
    std::lock_guard lock(mutex_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->cancelled()) {
        gone.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& ch : gone) {
    ch->finish(ch->cancel_reason());
    metrics_.count_finished(finish_reason_name(ch->cancel_reason()));
  }
}

void Scheduler::step() {
  // Decoding sequences first (one token each, so streaming never stalls), then prompt chunks in arrival order.
  std::vector<StepChunk> chunks;
  std::vector<size_t> owners;
  int64_t budget = config_.max_num_batched_tokens;
  for (size_t i = 0; i < running_.size(); ++i) {
    const Sequence& seq = running_[i];
    if (seq.computed >= seq.prompt_len) {
      chunks.push_back({seq.slot, seq.computed, std::span(seq.tokens).subspan(static_cast<size_t>(seq.computed), 1)});
      owners.push_back(i);
      --budget;
    }
  }
  for (size_t i = 0; i < running_.size(); ++i) {
    const Sequence& seq = running_[i];
    if (seq.computed >= seq.prompt_len) continue;
    // At least one prompt token per step even when decodes used the budget up, so prefill always progresses.
    const int64_t take = std::min(seq.prompt_len - seq.computed, std::max<int64_t>(budget, chunks.empty() ? 1 : 0));
    if (take <= 0) break;
    chunks.push_back({seq.slot, seq.computed,
                      std::span(seq.tokens).subspan(static_cast<size_t>(seq.computed), static_cast<size_t>(take))});
    owners.push_back(i);
    budget -= take;
  }
  if (chunks.empty()) return;
  metrics_.observe_iteration_tokens(config_.max_num_batched_tokens - budget);

  try {
    logits_ = model_.forward(chunks);
  } catch (const std::exception& e) {
    for (const size_t i : owners) finish(running_[i], FinishReason::kError, fmt::format("forward step failed: {}", e.what()));
    std::erase_if(running_, [](const Sequence& s) { return s.slot < 0; });
    return;
  }
  const int64_t vocab = model_.vocab_size();
  const auto now = Clock::now();
  for (size_t c = 0; c < chunks.size(); ++c) {
    Sequence& seq = running_[owners[c]];
    seq.computed += static_cast<int64_t>(chunks[c].tokens.size());
    if (seq.computed < static_cast<int64_t>(seq.tokens.size())) continue;  // prompt not finished yet
    const SequenceRequest& req = seq.channel->request();
    const std::span<float> row(logits_.data() + static_cast<size_t>(c) * static_cast<size_t>(vocab),
                               static_cast<size_t>(vocab));
    // Logprobs are of the raw logits; the sampler rewrites the row in place.
    if (req.top_logprobs >= 0) raw_row_.assign(row.begin(), row.end());
    const int32_t token = seq.sampler->sample(row);
    if (seq.generated == 0) {
      metrics_.observe_ttft(seconds_between(req.arrival, now));
      seq.first_token = now;
    } else {
      metrics_.observe_inter_token(seconds_between(seq.last_token, now));
    }
    seq.last_token = now;
    const bool eos = std::find(req.eos_token_ids.begin(), req.eos_token_ids.end(), token) != req.eos_token_ids.end();
    const bool stop_id = std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), token) != req.stop_token_ids.end();
    if ((eos && !req.ignore_eos) || stop_id) {
      finish(seq, FinishReason::kStop);
      continue;
    }
    seq.sampler->observe(token);
    seq.tokens.push_back(token);
    ++seq.generated;
    metrics_.add_generation_tokens(1);
    if (req.top_logprobs >= 0) {
      runtime::TokenLogprobs lp = runtime::token_logprobs(raw_row_, token, req.top_logprobs);
      seq.channel->push_token(token, &lp);
    } else {
      seq.channel->push_token(token);
    }
    if (seq.generated >= req.max_new_tokens) finish(seq, FinishReason::kLength);
  }
  std::erase_if(running_, [](const Sequence& s) { return s.slot < 0; });
}

void Scheduler::finish(Sequence& seq, FinishReason reason, const std::string& error) {
  if (seq.slot < 0) return;
  model_.release_slot(seq.slot);
  seq.slot = -1;
  seq.channel->finish(reason, error);
  const auto now = Clock::now();
  metrics_.count_finished(finish_reason_name(reason));
  metrics_.observe_e2e(seconds_between(seq.channel->request().arrival, now));
  const bool decoded = seq.generated > 0;
  metrics_.observe_request(RequestTimes{seconds_between(seq.admitted, decoded ? seq.first_token : now),
                                        decoded ? seconds_between(seq.first_token, now) : 0.0,
                                        seconds_between(seq.admitted, now), seq.prompt_len, seq.generated});
}

void Scheduler::publish_state() {
  int waiting = 0;
  {
    std::lock_guard lock(mutex_);
    waiting = static_cast<int>(queue_.size());
  }
  int64_t cached = 0;
  for (const auto& seq : running_) cached += seq.computed;
  const int used = static_cast<int>(running_.size());
  metrics_.set_scheduler_state(used, waiting, used, model_.max_slots(), cached);
}

}  // namespace fp4serve::server
