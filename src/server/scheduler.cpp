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
  // From here on the kernels run on the scheduler's thread: the caller's (the loader's) idle OpenMP team would only
  // make libgomp stop spinning the scheduler's team between parallel regions.
  core::release_idle_threads();
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
  for (auto& seq : preempted_) finish(seq, FinishReason::kError, "the server is shutting down");
  preempted_.clear();
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

int Scheduler::max_running() const { return std::min(config_.max_num_seqs, model_.max_slots()); }

std::vector<std::shared_ptr<RequestChannel>> Scheduler::submit_n(SequenceRequest request, int n) {
  if (n < 1 || n > max_running()) {
    throw UsageError(fmt::format("n = {} choices need as many sequences running at once; this server runs at most {} "
                                 "(--max-num-seqs and the KV-cache slots)", n, max_running()));
  }
  // n sequences queued together (one lock: nothing comes between them); choice i > 0 samples with seed + i. The
  // group id lets admit() and unpark() compute their prompt once.
  std::vector<std::shared_ptr<RequestChannel>> all;
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || static_cast<int>(queue_.size()) + n > config_.max_queue) return {};
    const uint64_t group = n > 1 ? next_group_++ : 0;
    for (int i = 0; i < n; ++i) {
      SequenceRequest copy = request;
      if (copy.sampling.seed) *copy.sampling.seed += static_cast<uint64_t>(i);
      copy.choice_group = group;
      all.push_back(std::make_shared<RequestChannel>(std::move(copy)));
    }
    for (const auto& ch : all) queue_.push_back(ch);
    metrics_.set_waiting(static_cast<int>(queue_.size()));
  }
  cv_.notify_all();
  return all;
}

void Scheduler::run() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || !running_.empty() || !preempted_.empty(); });
      if (stopping_) return;
    }
    drop_cancelled();
    unpark();
    step();
    publish_state();
  }
}

void Scheduler::drop_cancelled() {
  for (auto& seq : running_) {
    if (seq.channel->cancelled()) finish(seq, seq.channel->cancel_reason());
  }
  std::erase_if(running_, [](const Sequence& s) { return s.done; });
  for (auto& seq : preempted_) {
    if (seq.channel->cancelled()) finish(seq, seq.channel->cancel_reason());
  }
  std::erase_if(preempted_, [](const Sequence& s) { return s.done; });
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

int64_t Scheduler::tokens_to_run(const Sequence& seq, int64_t budget, bool first_chunk) {
  const auto pending = static_cast<int64_t>(seq.tokens.size()) - seq.computed;
  return std::min(pending, std::max<int64_t>(budget, first_chunk ? 1 : 0));
}

void Scheduler::preempt(Sequence& seq) {
  model_.cache().release(seq.slot);
  seq.slot = -1;
  seq.holds_window = false;
  seq.computed = 0;
  seq.take = 0;
  ++preemptions_;
}

// Positions of `prompt` a choice can take from another instead of computing (the full blocks before its last
// token); 0: the prompt is too short to share.
static int64_t shareable(int64_t prompt_len, int64_t block_size) { return (prompt_len - 1) / block_size * block_size; }

const Scheduler::Sequence* Scheduler::fork_donor(const Sequence& seq, bool& computing) const {
  computing = false;
  const model::KvCache& cache = model_.cache();
  const int64_t need = shareable(seq.prompt_len, cache.block_size());
  const Sequence* donor = nullptr;
  for (const Sequence& other : running_) {
    if (&other == &seq || other.group != seq.group || other.parked || other.slot < 0 || other.done) continue;
    if (cache.num_tokens(other.slot) >= need) {
      donor = &other;
    } else {
      computing = true;
    }
  }
  return need > 0 ? donor : nullptr;
}

void Scheduler::hold_for_choices(Sequence& seq) {
  model::KvCache& cache = model_.cache();
  cache.hold_window(seq.slot, shareable(seq.prompt_len, cache.block_size()));
  seq.holds_window = true;
}

void Scheduler::release_window_holds() {
  for (Sequence& seq : running_) {
    if (!seq.holds_window) continue;
    bool waiting = std::ranges::any_of(running_, [&](const Sequence& other) {
      return other.group == seq.group && other.parked && !other.done;
    });
    if (!waiting) {
      std::lock_guard lock(mutex_);
      waiting = std::ranges::any_of(queue_, [&](const std::shared_ptr<RequestChannel>& ch) {
        return ch->request().choice_group == seq.group;
      });
    }
    if (waiting) continue;
    if (seq.slot >= 0 && !seq.done) model_.cache().hold_window(seq.slot, -1);
    seq.holds_window = false;
  }
}

void Scheduler::lead(Sequence& seq) {
  const int64_t hit = model_.cache().match_prefix(seq.slot, std::span<const int32_t>(seq.tokens));
  hold_for_choices(seq);
  seq.parked = false;
  seq.computed = hit;
  seq.channel->set_cached_tokens(hit);
  metrics_.add_prompt_tokens_computed(seq.prompt_len - hit);
}

void Scheduler::unpark() {
  model::KvCache& cache = model_.cache();
  for (Sequence& seq : running_) {
    if (!seq.parked) continue;
    bool computing = false;
    if (const Sequence* donor = fork_donor(seq, computing)) {
      const int64_t shared = cache.fork(donor->slot, seq.slot, std::span<const int32_t>(seq.tokens));
      if (shared == 0) {
        lead(seq);  // a sliding window already released what it would read: compute it (from the cache, if held)
        continue;
      }
      seq.parked = false;
      seq.computed = shared;
      seq.channel->set_cached_tokens(shared);
      metrics_.add_prompt_tokens_computed(seq.prompt_len - shared);
    } else if (!computing) {
      lead(seq);  // no choice of its request computes the prompt any more: this one does
    }
  }
  release_window_holds();
}

void Scheduler::admit(int64_t& budget, bool& first_chunk) {
  model::KvCache& cache = model_.cache();
  const int limit = std::min(config_.max_num_seqs, model_.max_slots());
  while (static_cast<int>(running_.size()) < limit && (budget > 0 || first_chunk)) {
    // A preempted sequence resumes before any new request (it keeps its sampler and generated tokens).
    Sequence seq;
    bool resumed = false;
    std::shared_ptr<RequestChannel> channel;
    if (!preempted_.empty()) {
      resumed = true;
    } else {
      std::lock_guard lock(mutex_);
      if (queue_.empty()) return;
      channel = queue_.front();
    }
    if (!resumed && channel->cancelled()) {
      {
        std::lock_guard lock(mutex_);
        queue_.pop_front();
        metrics_.set_waiting(static_cast<int>(queue_.size()));
      }
      channel->finish(channel->cancel_reason());
      metrics_.count_finished(finish_reason_name(channel->cancel_reason()));
      continue;
    }
    const std::span<const int32_t> tokens =
        resumed ? std::span<const int32_t>(preempted_.front().tokens) : std::span<const int32_t>(channel->request().prompt);
    const int slot = cache.acquire();
    if (slot < 0) return;
    // A choice of an n > 1 request waits for (parks) or forks its group's prompt instead of computing it again.
    Sequence probe;
    probe.group = resumed ? preempted_.front().group : channel->request().choice_group;
    probe.prompt_len = static_cast<int64_t>(tokens.size());
    bool computing = false;
    const Sequence* donor = probe.group != 0 ? fork_donor(probe, computing) : nullptr;
    const bool park = !resumed && donor == nullptr && computing;
    int64_t hit = 0;
    if (donor != nullptr) hit = cache.fork(donor->slot, slot, tokens);
    const bool forked = hit > 0;
    if (hit == 0 && !park) hit = cache.match_prefix(slot, tokens);
    // Blocks for the first chunk decide admission: without them the sequence keeps its place.
    const auto pending = static_cast<int64_t>(tokens.size()) - hit;
    const int64_t take = park ? 0 : std::min(pending, std::max<int64_t>(budget, first_chunk ? 1 : 0));
    if (!park && !cache.reserve(slot, hit + take)) {
      cache.release(slot);
      return;
    }
    if (resumed) {
      seq = std::move(preempted_.front());
      preempted_.pop_front();
    } else {
      {
        std::lock_guard lock(mutex_);
        queue_.pop_front();
        metrics_.set_waiting(static_cast<int>(queue_.size()));
      }
      const SequenceRequest& req = channel->request();
      seq.channel = std::move(channel);
      seq.tokens.reserve(req.prompt.size() + static_cast<size_t>(req.max_new_tokens));
      seq.tokens = req.prompt;
      seq.prompt_len = static_cast<int64_t>(req.prompt.size());
      seq.sampler.emplace(req.sampling);
      seq.sampler->observe_prompt(req.prompt);
      if (req.grammar != nullptr) seq.grammar.emplace(req.grammar);
      seq.grammar_waits = req.grammar != nullptr && req.grammar_after_token >= 0;
      seq.admitted = Clock::now();
      seq.group = req.choice_group;
      seq.parked = park;
      if (!park) {
        seq.channel->set_cached_tokens(hit);
        metrics_.add_prompt_tokens_computed(seq.prompt_len - hit);
      }
      metrics_.add_prompt_tokens(seq.prompt_len);
      metrics_.observe_queue_time(seconds_between(req.arrival, seq.admitted));
    }
    seq.slot = slot;
    seq.computed = hit;
    seq.take = take;
    // The first choice of an n > 1 request computes the prompt the others will fork.
    if (seq.group != 0 && !park && !forked) hold_for_choices(seq);
    budget -= take;
    first_chunk = first_chunk && take == 0;
    running_.push_back(std::move(seq));
  }
}

void Scheduler::step() {
  model::KvCache& cache = model_.cache();
  int64_t budget = config_.max_num_batched_tokens;
  bool first_chunk = true;
  bool preempted = false;
  // Running sequences first: decodes (one token each, so streaming never stalls), then prompt chunks in arrival
  // order. A sequence that cannot get its blocks preempts the most recently admitted one until it can (or is
  // itself the one preempted).
  std::vector<size_t> order;
  for (size_t i = 0; i < running_.size(); ++i) {
    if (static_cast<int64_t>(running_[i].tokens.size()) - running_[i].computed == 1) order.push_back(i);
  }
  for (size_t i = 0; i < running_.size(); ++i) {
    if (static_cast<int64_t>(running_[i].tokens.size()) - running_[i].computed > 1) order.push_back(i);
  }
  for (const size_t i : order) {
    Sequence& seq = running_[i];
    seq.take = 0;
    if (seq.slot < 0 || seq.parked) continue;  // preempted by an earlier sequence of this step, or parked
    const int64_t take = tokens_to_run(seq, budget, first_chunk);
    if (take <= 0) continue;
    while (seq.slot >= 0 && !cache.reserve(seq.slot, seq.computed + take)) {
      size_t victim = running_.size();
      // Parked choices hold no blocks: preempting them frees nothing.
      while (victim > 0 && (running_[victim - 1].slot < 0 || running_[victim - 1].parked)) --victim;
      budget += running_[victim - 1].take;  // a victim scheduled earlier in this step gives its tokens back
      preempt(running_[victim - 1]);
      preempted = true;
    }
    if (seq.slot < 0) continue;
    seq.take = take;
    budget -= take;
    first_chunk = false;
  }
  // Preempted sequences wait ahead of the queue, the earliest admitted first.
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (it->slot < 0) preempted_.push_front(std::move(*it));
  }
  std::erase_if(running_, [](const Sequence& s) { return s.slot < 0; });
  if (!preempted) admit(budget, first_chunk);

  // The chunks point into running_'s token vectors: built once running_ no longer changes this step.
  std::vector<StepChunk> chunks;
  std::vector<size_t> owners;
  for (size_t i = 0; i < running_.size(); ++i) {
    const Sequence& seq = running_[i];
    if (seq.take <= 0) continue;
    chunks.push_back({seq.slot, seq.computed,
                      std::span(seq.tokens).subspan(static_cast<size_t>(seq.computed), static_cast<size_t>(seq.take))});
    owners.push_back(i);
  }
  if (chunks.empty()) return;
  metrics_.observe_iteration_tokens(config_.max_num_batched_tokens - budget);

  try {
    logits_ = model_.forward(chunks);
  } catch (const std::exception& e) {
    for (const size_t i : owners) finish(running_[i], FinishReason::kError, fmt::format("forward step failed: {}", e.what()));
    std::erase_if(running_, [](const Sequence& s) { return s.done; });
    return;
  }
  const int64_t vocab = model_.vocab_size();
  const auto now = Clock::now();
  for (size_t c = 0; c < chunks.size(); ++c) {
    Sequence& seq = running_[owners[c]];
    seq.computed += static_cast<int64_t>(chunks[c].tokens.size());
    seq.take = 0;
  }
  unpark();  // before a leader that just computed its prompt can finish (and free its blocks) in emit()
  for (size_t c = 0; c < chunks.size(); ++c) {
    Sequence& seq = running_[owners[c]];
    if (seq.computed < static_cast<int64_t>(seq.tokens.size())) continue;  // prompt (or recomputation) not finished
    const std::span<float> row(logits_.data() + static_cast<size_t>(c) * static_cast<size_t>(vocab),
                               static_cast<size_t>(vocab));
    emit(seq, row, now);
  }
  std::erase_if(running_, [](const Sequence& s) { return s.done; });
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
  if (seq.done) return;
  seq.done = true;
  if (seq.slot >= 0) model_.cache().release(seq.slot);
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
    waiting = static_cast<int>(queue_.size() + preempted_.size());
  }
  int64_t cached = 0;
  for (const auto& seq : running_) cached += seq.computed;
  const int used = static_cast<int>(running_.size());
  metrics_.set_scheduler_state(used, waiting, used, model_.max_slots(), cached);
  const model::KvCache& cache = model_.cache();
  metrics_.set_kv_state(cache.num_blocks() - cache.free_blocks(), cache.num_blocks(), cache.prefix_cache_queries(),
                        cache.prefix_cache_hits(), preemptions_);
}

}  // namespace fp4serve::server
