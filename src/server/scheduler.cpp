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

int Scheduler::running_count() const {
  int n = 0;
  for (const auto& seq : running_) n += 1 + static_cast<int>(seq.forks.size());
  return n;
}

int Scheduler::max_running() const { return std::min(config_.max_num_seqs, model_.max_slots()); }

std::vector<std::shared_ptr<RequestChannel>> Scheduler::submit_n(SequenceRequest request, int n) {
  if (n < 1 || n > max_running()) {
    throw UsageError(fmt::format("n = {} choices need as many sequences running at once; this server runs at most {} "
                                 "(--max-num-seqs and the KV-cache slots)", n, max_running()));
  }
  if (n == 1) {
    auto one = submit(std::move(request));
    return one ? std::vector{one} : std::vector<std::shared_ptr<RequestChannel>>{};
  }
  std::vector<std::shared_ptr<RequestChannel>> all(1);
  for (int i = 1; i < n; ++i) {
    SequenceRequest copy = request;
    if (copy.sampling.seed) *copy.sampling.seed += static_cast<uint64_t>(i);
    all.push_back(std::make_shared<RequestChannel>(std::move(copy)));
  }
  request.siblings.assign(all.begin() + 1, all.end());
  all[0] = submit(std::move(request));
  if (all[0] == nullptr) return {};
  return all;
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

Scheduler::Sequence Scheduler::start_sequence(std::shared_ptr<RequestChannel> channel, int slot) {
  const SequenceRequest& req = channel->request();
  Sequence seq;
  seq.channel = std::move(channel);
  seq.slot = slot;
  seq.tokens.reserve(req.prompt.size() + static_cast<size_t>(req.max_new_tokens));
  seq.tokens = req.prompt;
  seq.prompt_len = static_cast<int64_t>(req.prompt.size());
  seq.sampler.emplace(req.sampling);
  seq.sampler->observe_prompt(req.prompt);
  if (req.grammar != nullptr) seq.grammar.emplace(req.grammar);
  seq.grammar_waits = req.grammar != nullptr && req.grammar_after_token >= 0;
  seq.admitted = Clock::now();
  return seq;
}

void Scheduler::admit() {
  const int limit = max_running();
  while (running_count() < limit) {
    std::shared_ptr<RequestChannel> channel;
    std::vector<int> slots;
    {
      std::lock_guard lock(mutex_);
      if (queue_.empty()) return;
      if (!queue_.front()->cancelled()) {
        // The KV-cache budget decides admission: without free slots (n of them for n choices) the request keeps
        // its place in the queue.
        const size_t wanted = 1 + queue_.front()->request().siblings.size();
        if (running_count() + static_cast<int>(wanted) > limit) return;
        while (slots.size() < wanted) {
          const int slot = model_.acquire_slot();
          if (slot < 0) break;
          slots.push_back(slot);
        }
        if (slots.size() < wanted) {
          for (const int slot : slots) model_.release_slot(slot);
          return;
        }
      }
      channel = std::move(queue_.front());
      queue_.pop_front();
      metrics_.set_waiting(static_cast<int>(queue_.size()));
    }
    if (slots.empty()) {  // cancelled while queued: it and its siblings end here
      channel->finish(channel->cancel_reason());
      for (const auto& sib : channel->request().siblings) sib->finish(channel->cancel_reason());
      metrics_.count_finished(finish_reason_name(channel->cancel_reason()));
      continue;
    }
    const SequenceRequest& req = channel->request();
    metrics_.add_prompt_tokens(static_cast<int64_t>(req.prompt.size()));
    metrics_.observe_queue_time(seconds_between(req.arrival, Clock::now()));
    const std::vector<std::shared_ptr<RequestChannel>> siblings = req.siblings;
    Sequence leader = start_sequence(std::move(channel), slots[0]);
    for (size_t i = 0; i < siblings.size(); ++i) {
      Sequence fork = start_sequence(siblings[i], slots[i + 1]);
      // Parked until the leader's prompt is cached, or prefilled beside it when the model cannot copy prefixes.
      if (model_.can_copy_prefix()) {
        leader.forks.push_back(std::move(fork));
      } else {
        running_.push_back(std::move(fork));
      }
    }
    running_.push_back(std::move(leader));
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
    for (const auto& sib : ch->request().siblings) sib->finish(ch->cancel_reason());  // n > 1: its other choices
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
  std::vector<Sequence> started;  // forks that begin decoding this step
  for (size_t c = 0; c < chunks.size(); ++c) {
    Sequence& seq = running_[owners[c]];
    seq.computed += static_cast<int64_t>(chunks[c].tokens.size());
    if (seq.computed < static_cast<int64_t>(seq.tokens.size())) continue;  // prompt not finished yet
    const std::span<float> row(logits_.data() + static_cast<size_t>(c) * static_cast<size_t>(vocab),
                               static_cast<size_t>(vocab));
    if (!seq.forks.empty()) start_forks(seq, row, now, started);
    emit(seq, row, now);
  }
  for (auto& seq : started) running_.push_back(std::move(seq));
  std::erase_if(running_, [](const Sequence& s) { return s.slot < 0; });
}

void Scheduler::start_forks(Sequence& seq, std::span<const float> row, Clock::time_point now,
                            std::vector<Sequence>& started) {
  std::vector<float> copy;
  for (auto& fork : seq.forks) {
    if (fork.channel->cancelled()) {
      finish(fork, fork.channel->cancel_reason());
      continue;
    }
    try {
      model_.copy_prefix(seq.slot, fork.slot, seq.prompt_len);
    } catch (const std::exception&) {
      started.push_back(std::move(fork));  // prefills itself from the next step on
      continue;
    }
    fork.computed = seq.prompt_len;
    copy.assign(row.begin(), row.end());
    emit(fork, copy, now);
    if (fork.slot >= 0) started.push_back(std::move(fork));
  }
  seq.forks.clear();
}

void Scheduler::emit(Sequence& seq, std::span<float> row, Clock::time_point now) {
  const SequenceRequest& req = seq.channel->request();
  // Logprobs are of the raw logits; the sampler rewrites the row in place.
  if (req.top_logprobs >= 0) raw_row_.assign(row.begin(), row.end());
  // Constrained decoding: only the tokens the grammar allows next can be sampled.
  const bool constrained = seq.grammar && !seq.grammar_waits;
  if (constrained) runtime::apply_token_bitmask(row, seq.grammar->next_token_bitmask());
  const int32_t token = seq.sampler->sample(row);
  if (seq.generated == 0) {
    metrics_.observe_ttft(seconds_between(req.arrival, now));
    seq.first_token = now;
  } else {
    metrics_.observe_inter_token(seconds_between(seq.last_token, now));
  }
  seq.last_token = now;
  if (seq.grammar_waits && token == req.grammar_after_token) {
    seq.grammar_waits = false;  // the reasoning ended: the next token is the first the grammar constrains
  } else if (constrained) {
    if (!seq.grammar->accept(token)) {  // only when nothing was allowed (min_tokens blocking the only stop token)
      finish(seq, FinishReason::kError, fmt::format("the grammar does not allow the sampled token {}", token));
      return;
    }
    if (seq.grammar->terminated()) {  // a stop token ended the grammar: not emitted, as EOS is not
      finish(seq, FinishReason::kStop);
      return;
    }
  }
  const bool eos = std::find(req.eos_token_ids.begin(), req.eos_token_ids.end(), token) != req.eos_token_ids.end();
  const bool stop_id = std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), token) != req.stop_token_ids.end();
  if ((eos && !req.ignore_eos) || stop_id) {
    finish(seq, FinishReason::kStop);
    return;
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

void Scheduler::finish(Sequence& seq, FinishReason reason, const std::string& error) {
  if (seq.slot < 0) return;
  for (auto& fork : seq.forks) finish(fork, reason, error);  // parked copies end with their prompt's sequence
  seq.forks.clear();
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
  const int used = running_count();
  metrics_.set_scheduler_state(used, waiting, used, model_.max_slots(), cached);
}

}  // namespace fp4serve::server
