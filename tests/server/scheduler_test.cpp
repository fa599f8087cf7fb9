// SPDX-License-Identifier: Apache-2.0
// The continuous-batching scheduler against FakeModel: batched, chunked-prefill, queued execution must give
// exactly the tokens of the sequential reference loop; cancellation, failures and shutdown free every slot.
#include "server/scheduler.h"

#include <gtest/gtest.h>

#include <omp.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "core/threading.h"
#include "fp4serve/error.h"
#include "server/fakes.h"

namespace fp4serve::server {
namespace {

using namespace std::chrono_literals;
using testing::FakeModel;

std::vector<int32_t> random_prompt(std::mt19937& rng, int len) {
  std::uniform_int_distribution<int> d(32, 126);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = d(rng);
  return p;
}

SequenceRequest greedy(std::vector<int32_t> prompt, int64_t max_new, bool ignore_eos = false) {
  SequenceRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.max_new_tokens = max_new;
  r.eos_token_ids = {testing::kEos};
  r.ignore_eos = ignore_eos;
  return r;
}

// Collects a channel's output, bounded in time so a scheduler bug fails the test instead of hanging it.
ChannelUpdate drain(RequestChannel& ch, std::vector<int32_t>& tokens) {
  const auto deadline = Clock::now() + 20s;
  while (Clock::now() < deadline) {
    auto u = ch.wait(50ms);
    tokens.insert(tokens.end(), u.tokens.begin(), u.tokens.end());
    if (u.finished) return u;
  }
  ADD_FAILURE() << "request did not finish within 20 s";
  return {};
}

TEST(Scheduler, BatchedChunkedQueuedMatchesSequentialGreedy) {
  FakeModel model(/*slots=*/5, /*max_len=*/256);
  Metrics metrics;
  // 12 requests, 5 slots (so some queue), 16 tokens per step (so prompts of up to 70 tokens prefill in chunks
  // while other sequences decode).
  Scheduler sched(model, {.max_num_seqs = 8, .max_num_batched_tokens = 16, .max_queue = 64}, metrics);
  std::mt19937 rng(1234);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> max_new;
  std::vector<std::shared_ptr<RequestChannel>> channels;
  for (int i = 0; i < 12; ++i) {
    prompts.push_back(random_prompt(rng, 3 + 6 * i));
    max_new.push_back(5 + (i * 7) % 23);
    channels.push_back(sched.submit(greedy(prompts.back(), max_new.back(), /*ignore_eos=*/i % 2 == 0)));
    ASSERT_NE(channels.back(), nullptr);
  }
  sched.start();  // after queueing all, so they share steps even though FakeModel is instant
  int64_t generated = 0;
  for (size_t i = 0; i < channels.size(); ++i) {
    std::vector<int32_t> tokens;
    const auto end = drain(*channels[i], tokens);
    const auto expect = testing::reference_greedy(prompts[i], max_new[i], i % 2 == 0);
    EXPECT_EQ(tokens, expect) << "request " << i;
    EXPECT_EQ(end.reason, static_cast<int64_t>(expect.size()) == max_new[i] ? FinishReason::kLength : FinishReason::kStop)
        << "request " << i;
    generated += static_cast<int64_t>(tokens.size());
  }
  EXPECT_GT(model.max_chunks.load(), 1) << "no step batched more than one sequence";
  EXPECT_LE(model.max_tokens.load(), 16) << "a step exceeded max_num_batched_tokens";
  EXPECT_GT(model.mixed_steps.load(), 0) << "no step mixed decodes with a prefill chunk";
  EXPECT_LE(model.max_used.load(), 5);
  sched.stop();
  EXPECT_EQ(metrics.running(), 0);
  EXPECT_NE(metrics.render().find("fp4serve_generation_tokens_total{model_name=\"\"} " + std::to_string(generated) + "\n"), std::string::npos);
}

TEST(Scheduler, SlotsBoundAdmission) {
  FakeModel model(/*slots=*/2, /*max_len=*/128);
  Metrics metrics;
  Scheduler sched(model, {.max_num_seqs = 8, .max_num_batched_tokens = 64, .max_queue = 16}, metrics);
  std::mt19937 rng(7);
  std::vector<std::shared_ptr<RequestChannel>> chs;
  for (int i = 0; i < 6; ++i) chs.push_back(sched.submit(greedy(random_prompt(rng, 9), 20, true)));
  sched.start();
  for (auto& ch : chs) {
    std::vector<int32_t> t;
    EXPECT_EQ(drain(*ch, t).reason, FinishReason::kLength);
    EXPECT_EQ(t.size(), 20u);
  }
  EXPECT_EQ(model.max_used.load(), 2);
  EXPECT_LE(model.max_chunks.load(), 2);
}

// The model's kernels run on the scheduler's thread, so the starting thread's idle OpenMP workers (left by loading
// the model) must end: libgomp stops spinning idle workers once it manages more threads than there are CPUs, and
// on a 2-CPU server every parallel region of every step then cost a futex sleep and wake-up (one stream decoded
// 2× slower than `generate`). Fails on a Scheduler::start that leaves them.
TEST(Scheduler, StartEndsTheCallersIdleOpenMpWorkers) {
  const auto process_threads = [] {
    int n = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
    return n;
  };
  core::release_idle_threads();  // earlier tests' teams, of any size
  std::atomic<int> seen{0};
#pragma omp parallel num_threads(2)
  seen.fetch_add(1);  // as loading does: this thread now keeps an idle worker
  ASSERT_EQ(seen.load(), 2);
  const int with_worker = process_threads();
  FakeModel model(1, 64);
  Metrics metrics;
  Scheduler sched(model, {.max_num_seqs = 1, .max_num_batched_tokens = 8, .max_queue = 2}, metrics);
  sched.start();
  // The scheduler's thread came, the idle worker went (it leaves /proc/self/task shortly after it is joined).
  int now = process_threads();
  for (int tries = 0; now != with_worker && tries < 400; ++tries) {
    std::this_thread::sleep_for(5ms);
    now = process_threads();
  }
  EXPECT_EQ(now, with_worker);
  std::mt19937 rng(5);
  auto ch = sched.submit(greedy(random_prompt(rng, 4), 3, true));
  ASSERT_NE(ch, nullptr);
  std::vector<int32_t> t;
  EXPECT_EQ(drain(*ch, t).reason, FinishReason::kLength);
  EXPECT_EQ(t.size(), 3u);
}

TEST(Scheduler, QueueFullRefuses) {
  FakeModel model(1, 64);
  Metrics metrics;
  Scheduler sched(model, {.max_num_seqs = 1, .max_num_batched_tokens = 8, .max_queue = 2}, metrics);
  // Not started: nothing leaves the queue.
  std::mt19937 rng(3);
  EXPECT_NE(sched.submit(greedy(random_prompt(rng, 4), 4)), nullptr);
  EXPECT_NE(sched.submit(greedy(random_prompt(rng, 4), 4)), nullptr);
  EXPECT_EQ(sched.submit(greedy(random_prompt(rng, 4), 4)), nullptr);
  EXPECT_EQ(metrics.waiting(), 2);
}

TEST(Scheduler, CancelFreesSlotAtNextStep) {
  FakeModel model(1, 512);
  model.before_forward = [] { std::this_thread::sleep_for(1ms); };
  Metrics metrics;
  Scheduler sched(model, {.max_num_seqs = 4, .max_num_batched_tokens = 32, .max_queue = 8}, metrics);
  sched.start();
  std::mt19937 rng(5);
  auto a = sched.submit(greedy(random_prompt(rng, 8), 400, true));
  auto b = sched.submit(greedy(random_prompt(rng, 8), 3, true));  // waits for the only slot
  std::vector<int32_t> ta;
  while (ta.size() < 3) {
    auto u = a->wait(1s);
    ASSERT_FALSE(u.finished);
    ta.insert(ta.end(), u.tokens.begin(), u.tokens.end());
  }
  a->cancel();
  std::vector<int32_t> rest, tb;
  EXPECT_EQ(drain(*a, rest).reason, FinishReason::kAbort);
  EXPECT_LT(ta.size() + rest.size(), 400u);
  EXPECT_EQ(drain(*b, tb).reason, FinishReason::kLength);  // got the freed slot
  EXPECT_EQ(tb.size(), 3u);
  EXPECT_EQ(metrics.finished("abort"), 1u);
}

TEST(Scheduler, CancelledWhileQueuedNeverRuns) {
  FakeModel model(1, 64);
  Metrics metrics;
  Scheduler sched(model, {.max_num_seqs = 1, .max_num_batched_tokens = 8, .max_queue = 4}, metrics);
  std::mt19937 rng(9);
  auto a = sched.submit(greedy(random_prompt(rng, 4), 2, true));
  a->cancel();
  sched.start();
  std::vector<int32_t> t;
  EXPECT_EQ(drain(*a, t).reason, FinishReason::kAbort);
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(model.steps.load(), 0);
}

TEST(Scheduler, ForwardFailureFailsThatStepOnly) {
  FakeModel model(4, 64);
  std::atomic<int> calls{0};
  model.before_forward = [&] {
    if (++calls == 3) throw std::runtime_error("injected kernel failure");
  };
  Metrics metrics;
  Scheduler sched(model, {.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_queue = 8}, metrics);
  sched.start();
  std::mt19937 rng(11);
  auto a = sched.submit(greedy(random_prompt(rng, 5), 10, true));
  std::vector<int32_t> t;
  const auto end = drain(*a, t);
  EXPECT_EQ(end.reason, FinishReason::kError);
  EXPECT_NE(end.error.find("injected kernel failure"), std::string::npos);
  auto b = sched.submit(greedy(random_prompt(rng, 5), 4, true));
  std::vector<int32_t> tb;
  EXPECT_EQ(drain(*b, tb).reason, FinishReason::kLength);
  EXPECT_EQ(tb.size(), 4u);
}

TEST(Scheduler, StopFailsUnfinished) {
  FakeModel model(1, 4096);
  model.before_forward = [] { std::this_thread::sleep_for(1ms); };
  Metrics metrics;
  Scheduler sched(model, {.max_num_seqs = 1, .max_num_batched_tokens = 8, .max_queue = 4}, metrics);
  sched.start();
  std::mt19937 rng(13);
  auto a = sched.submit(greedy(random_prompt(rng, 4), 4000, true));
  auto b = sched.submit(greedy(random_prompt(rng, 4), 4, true));
  a->wait(1s);
  sched.stop();
  std::vector<int32_t> t;
  EXPECT_EQ(drain(*a, t).reason, FinishReason::kError);
  EXPECT_EQ(drain(*b, t).reason, FinishReason::kError);
  EXPECT_EQ(sched.submit(greedy(random_prompt(rng, 4), 4)), nullptr);
}

// n > 1: n sequences queued together; greedy choices are identical and equal the sequential reference, with
// prefix caching off and on (a choice admitted after another computed the prompt's blocks may reuse them).
TEST(Scheduler, ChoicesOfOneRequestGiveIdenticalGreedyTokens) {
  std::mt19937 rng(41);
  const auto prompt = random_prompt(rng, 37);
  const auto expected = testing::reference_greedy(prompt, 20, true);
  for (const bool caching : {false, true}) {
    SCOPED_TRACE(caching ? "prefix caching" : "no prefix caching");
    FakeModel model(4, 256, 0, 16, caching);
    Metrics metrics;
    Scheduler sched(model, {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_queue = 8}, metrics);
    sched.start();
    auto channels = sched.submit_n(greedy(prompt, 20, true), 3);
    ASSERT_EQ(channels.size(), 3u);
    for (auto& ch : channels) {
      std::vector<int32_t> t;
      EXPECT_EQ(drain(*ch, t).reason, FinishReason::kLength);
      EXPECT_EQ(t, expected);
    }
  }
}

// Three seeded choices of one request (seed `seed`), then three lone requests with seeds seed + i, on one
// scheduler: each choice must sample what its lone request samples, and the choices differ. Returns the channel
// of the last choice (for its cached_tokens) after all of them finished.
std::shared_ptr<RequestChannel> expect_choices_follow_seed_plus_index(Scheduler& sched, const std::vector<int32_t>& prompt,
                                                                      uint64_t seed) {
  auto sampled = [&](uint64_t s) {
    SequenceRequest r = greedy(prompt, 12, true);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = s;
    return r;
  };
  auto channels = sched.submit_n(sampled(seed), 3);
  EXPECT_EQ(channels.size(), 3u);
  std::vector<std::vector<int32_t>> outs;
  for (auto& ch : channels) {
    std::vector<int32_t> t;
    drain(*ch, t);
    outs.push_back(t);
  }
  for (uint64_t i = 0; i < outs.size(); ++i) {
    auto lone = sched.submit(sampled(seed + i));
    std::vector<int32_t> t;
    drain(*lone, t);
    EXPECT_EQ(t, outs[i]) << "choice " << i;
  }
  EXPECT_NE(outs[0], outs[1]);
  EXPECT_NE(outs[1], outs[2]);
  return channels.back();
}

// Seeded choices sample with seed + i, as vLLM's child requests do: choice i is the lone request with that seed.
TEST(Scheduler, SeededChoicesFollowSeedPlusIndex) {
  std::mt19937 rng(7);
  const auto prompt = random_prompt(rng, 9);
  FakeModel model(4, 256);
  Metrics metrics;
  Scheduler sched(model, {.max_num_seqs = 4, .max_num_batched_tokens = 32, .max_queue = 8}, metrics);
  sched.start();
  expect_choices_follow_seed_plus_index(sched, prompt, 100);
  SequenceRequest more = greedy(prompt, 12, true);
  EXPECT_THROW(sched.submit_n(more, 5), UsageError);  // more choices than the batch runs
}

// Choices cancelled while queued, and mid-prefill (steps slowed so the cancel lands there), end as aborted and
// free every slot.
TEST(Scheduler, CancelledChoicesFreeTheirSlots) {
  std::mt19937 rng(3);
  FakeModel model(3, 256);
  model.before_forward = [] { std::this_thread::sleep_for(2ms); };
  Metrics metrics;
  Scheduler sched(model, {.max_num_seqs = 3, .max_num_batched_tokens = 4, .max_queue = 8}, metrics);
  auto queued = sched.submit_n(greedy(random_prompt(rng, 20), 5, true), 3);  // not started: stays queued
  ASSERT_EQ(queued.size(), 3u);
  for (auto& ch : queued) ch->cancel();
  sched.start();
  for (auto& ch : queued) {
    std::vector<int32_t> t;
    EXPECT_EQ(drain(*ch, t).reason, FinishReason::kAbort);
  }
  auto channels = sched.submit_n(greedy(random_prompt(rng, 120), 5, true), 3);  // 30 prefill steps of ≥ 2 ms
  ASSERT_EQ(channels.size(), 3u);
  ASSERT_TRUE([&] {
    for (int i = 0; i < 2000 && model.steps.load() < 3; ++i) std::this_thread::sleep_for(1ms);
    return model.steps.load() >= 3;
  }());
  for (auto& ch : channels) ch->cancel();
  for (auto& ch : channels) {
    std::vector<int32_t> t;
    EXPECT_EQ(drain(*ch, t).reason, FinishReason::kAbort);
  }
  auto again = sched.submit_n(greedy(random_prompt(rng, 6), 4, true), 3);  // needs all three slots
  ASSERT_EQ(again.size(), 3u);
  for (auto& ch : again) {
    std::vector<int32_t> t;
    EXPECT_EQ(drain(*ch, t).reason, FinishReason::kLength);
  }
}

TEST(Scheduler, RejectsBadConfig) {
  FakeModel model(1, 64);
  Metrics metrics;
  EXPECT_THROW(Scheduler(model, {.max_num_seqs = 0, .max_num_batched_tokens = 8, .max_queue = 4}, metrics), UsageError);
  EXPECT_THROW(Scheduler(model, {.max_num_seqs = 1, .max_num_batched_tokens = 0, .max_queue = 4}, metrics), UsageError);
}


// A pool far smaller than the running sequences need: 8 sequences of up to 20 + 40 positions over 12 blocks of 8
// (each needs up to 8 blocks). Running sequences outgrow the pool, the latest admitted are preempted and
// recomputed from prompt + generated tokens, and every request still gets exactly the sequential greedy tokens.
TEST(Scheduler, PreemptionByRecomputeGivesTheSameTokens) {
  for (const bool prefix_caching : {false, true}) {
    SCOPED_TRACE(prefix_caching ? "prefix caching on" : "prefix caching off");
    FakeModel model(/*slots=*/8, /*max_len=*/64, /*num_blocks=*/12, /*block_size=*/8, prefix_caching);
    Metrics metrics;
    Scheduler sched(model, {.max_num_seqs = 8, .max_num_batched_tokens = 32, .max_queue = 64}, metrics);
    std::mt19937 rng(99);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::shared_ptr<RequestChannel>> channels;
    for (int i = 0; i < 8; ++i) {
      prompts.push_back(random_prompt(rng, 5 + 2 * i));
      channels.push_back(sched.submit(greedy(prompts.back(), 40, /*ignore_eos=*/true)));
    }
    sched.start();
    for (size_t i = 0; i < channels.size(); ++i) {
      std::vector<int32_t> tokens;
      EXPECT_EQ(drain(*channels[i], tokens).reason, FinishReason::kLength) << "request " << i;
      EXPECT_EQ(tokens, testing::reference_greedy(prompts[i], 40, true)) << "request " << i;
    }
    sched.stop();
    const std::string text = metrics.render();
    const auto at = text.find("fp4serve_num_preemptions_total{");
    ASSERT_NE(at, std::string::npos);
    const auto value = std::stoll(text.substr(text.find("} ", at) + 2));
    EXPECT_GT(value, 0) << "the pool never ran dry: the test does not exercise preemption";
    EXPECT_EQ(model.cache().free_blocks(), 12) << "blocks leaked";
    model.cache().pool().check_invariants();
  }
}

// The same long prompt twice, one after the other: the second finds its full blocks in the prefix cache, computes
// only the rest, reports them as cached tokens, and generates the same tokens.
TEST(Scheduler, PrefixCacheHitComputesOnlyTheRestAndGivesTheSameTokens) {
  FakeModel model(/*slots=*/4, /*max_len=*/256, /*num_blocks=*/0, /*block_size=*/16, /*prefix_caching=*/true);
  Metrics metrics;
  Scheduler sched(model, {.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_queue = 8}, metrics);
  std::mt19937 rng(5);
  const std::vector<int32_t> prompt = random_prompt(rng, 100);
  sched.start();
  std::vector<int32_t> first, second;
  auto a = sched.submit(greedy(prompt, 10, true));
  drain(*a, first);
  const int64_t computed_cold = model.computed_tokens.load();
  auto b = sched.submit(greedy(prompt, 10, true));
  drain(*b, second);
  EXPECT_EQ(first, second);
  EXPECT_EQ(a->cached_tokens(), 0);
  EXPECT_EQ(b->cached_tokens(), 96);  // 6 full blocks of 16 (the 100th token is always computed)
  EXPECT_EQ(model.computed_tokens.load() - computed_cold, computed_cold - 96);
  sched.stop();
  EXPECT_EQ(model.cache().prefix_cache_hits(), 96);
  EXPECT_EQ(model.cache().prefix_cache_queries(), 200);
}

int64_t metric_value(const std::string& text, const std::string& name) {
  const auto at = text.find(name + "{");
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(text.find("} ", at) + 2));
}

// Three greedy choices of `prompt` (n = 3, `tokens` each) through a scheduler over `model` with `budget` tokens per
// step: each must finish by length with `expected`; afterwards every block is back in the pool. Returns the
// channels and the metrics' text after the scheduler stopped.
struct ChoicesRun {
  std::vector<std::shared_ptr<RequestChannel>> channels;
  std::string metrics;
};
ChoicesRun run_greedy_choices(FakeModel& model, const std::vector<int32_t>& prompt, int tokens, int64_t budget,
                              const std::vector<int32_t>& expected) {
  Metrics metrics;
  Scheduler sched(model, {.max_num_seqs = 4, .max_num_batched_tokens = budget, .max_queue = 8}, metrics);
  sched.start();
  ChoicesRun run;
  run.channels = sched.submit_n(greedy(prompt, tokens, true), 3);
  EXPECT_EQ(run.channels.size(), 3u);
  for (auto& ch : run.channels) {
    std::vector<int32_t> t;
    EXPECT_EQ(drain(*ch, t).reason, FinishReason::kLength);
    EXPECT_EQ(t, expected);
  }
  sched.stop();
  run.metrics = metrics.render();
  EXPECT_EQ(model.cache().free_blocks(), model.cache().num_blocks()) << "blocks leaked";
  model.cache().pool().check_invariants();
  return run;
}

// n = 3 computes the prompt once, with prefix caching off and on: the leader prefills 100 tokens, each other choice
// forks its 6 full blocks and computes the last 4 (the block holding the last prompt token), so 108 prompt
// positions in all instead of 300; greedy choices equal the sequential reference; every block comes back. With a
// budget of 32 tokens per step the other choices are admitted once the leader's prompt is computed; with 256 they
// are admitted in the leader's step and wait parked until it has computed the prompt.
TEST(Scheduler, ChoicesComputeThePromptOnce) {
  std::mt19937 rng(17);
  const auto prompt = random_prompt(rng, 100);
  const auto expected = testing::reference_greedy(prompt, 10, true);
  for (const auto& [caching, budget] : {std::pair{false, 32}, std::pair{true, 32}, std::pair{false, 256},
                                        std::pair{true, 256}}) {
    SCOPED_TRACE(fmt::format("prefix caching {}, {} tokens per step", caching, budget));
    FakeModel model(/*slots=*/4, /*max_len=*/256, /*num_blocks=*/0, /*block_size=*/16, caching);
    const ChoicesRun run = run_greedy_choices(model, prompt, 10, budget, expected);
    EXPECT_EQ(run.channels[0]->cached_tokens(), 0);
    EXPECT_EQ(run.channels[1]->cached_tokens(), 96);
    EXPECT_EQ(run.channels[2]->cached_tokens(), 96);
    // Prompt positions 100 + 2 · 4, then 9 decode steps per choice (the 10th token is never fed back).
    EXPECT_EQ(model.computed_tokens.load(), 108 + 3 * 9);
    EXPECT_EQ(metric_value(run.metrics, "fp4serve_prompt_tokens_computed_total"), 108);
    EXPECT_EQ(metric_value(run.metrics, "fp4serve_prompt_tokens_total"), 300);
  }
}

// A sliding-window layer beside a full one (GPT-OSS's KV layer groups), window 32, blocks of 16, caching off: the
// leader's commit of its 111-token prompt would release its sliding blocks 0 … 4 (position 111 reads 80 …), but a
// choice computes from position 96, which reads 65 …, in block 4. The leader holds that block until the choices have
// forked, so each computes only positions 96 … 110: 111 + 2 · 15 prompt positions (without the hold: 111 · 3).
TEST(Scheduler, ChoicesForkPastASlidingWindow) {
  std::mt19937 rng(19);
  const auto prompt = random_prompt(rng, 111);
  const auto expected = testing::reference_greedy(prompt, 6, true);
  for (const int64_t budget : {32, 256}) {
    SCOPED_TRACE(fmt::format("{} tokens per step", budget));
    FakeModel model(/*slots=*/4, /*max_len=*/256, /*num_blocks=*/0, /*block_size=*/16, /*prefix_caching=*/false,
                    /*layer_windows=*/{32, 0});
    ASSERT_EQ(model.cache().num_groups(), 2);
    const ChoicesRun run = run_greedy_choices(model, prompt, 6, budget, expected);
    EXPECT_EQ(metric_value(run.metrics, "fp4serve_prompt_tokens_computed_total"), 111 + 2 * 15);
  }
}

// Seeded choices that fork a long prompt sample exactly what a lone request with seed + i samples (which computes
// the whole prompt itself), and differ from each other.
TEST(Scheduler, ForkedSeededChoicesMatchLoneRequests) {
  std::mt19937 rng(71);
  const auto prompt = random_prompt(rng, 53);
  FakeModel model(4, 256);
  Metrics metrics;
  Scheduler sched(model, {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_queue = 8}, metrics);
  sched.start();
  EXPECT_EQ(expect_choices_follow_seed_plus_index(sched, prompt, 500)->cached_tokens(), 48);
}

// The leader cancelled while it prefills: a parked choice takes over and computes the prompt, the third forks it,
// both still give the reference tokens. A forked choice cancelled while decoding frees its own blocks only. No
// block leaks, with prefix caching off and on.
TEST(Scheduler, CancelledChoicesOfAForkedPromptLeakNothing) {
  std::mt19937 rng(23);
  const auto prompt = random_prompt(rng, 120);
  const auto expected = testing::reference_greedy(prompt, 40, true);
  for (const bool caching : {false, true}) {
    SCOPED_TRACE(caching ? "prefix caching" : "no prefix caching");
    FakeModel model(3, 256, 0, 16, caching);
    model.before_forward = [] { std::this_thread::sleep_for(1ms); };
    Metrics metrics;
    Scheduler sched(model, {.max_num_seqs = 3, .max_num_batched_tokens = 8, .max_queue = 8}, metrics);
    sched.start();
    auto channels = sched.submit_n(greedy(prompt, 40, true), 3);  // 15 prefill steps of ≥ 1 ms
    ASSERT_EQ(channels.size(), 3u);
    ASSERT_TRUE([&] {
      for (int i = 0; i < 2000 && model.steps.load() < 3; ++i) std::this_thread::sleep_for(1ms);
      return model.steps.load() >= 3;
    }());
    channels[0]->cancel();
    std::vector<int32_t> t0;
    EXPECT_EQ(drain(*channels[0], t0).reason, FinishReason::kAbort);
    // Choice 2 forks choice 1's prompt; once it decodes, cancel it.
    ASSERT_TRUE([&] {
      for (int i = 0; i < 5000 && channels[2]->cached_tokens() == 0; ++i) std::this_thread::sleep_for(1ms);
      return channels[2]->cached_tokens() > 0;
    }());
    std::vector<int32_t> t1, t2;
    const auto u = channels[2]->wait(5s);
    t2.insert(t2.end(), u.tokens.begin(), u.tokens.end());
    channels[2]->cancel();
    drain(*channels[2], t2);
    EXPECT_LT(t2.size(), expected.size());
    EXPECT_TRUE(std::equal(t2.begin(), t2.end(), expected.begin()));
    EXPECT_EQ(drain(*channels[1], t1).reason, FinishReason::kLength);
    EXPECT_EQ(t1, expected);
    EXPECT_EQ(channels[2]->cached_tokens(), 112);
    sched.stop();
    EXPECT_EQ(model.cache().free_blocks(), model.cache().num_blocks()) << "blocks leaked";
    model.cache().pool().check_invariants();
  }
}

}  // namespace
}  // namespace fp4serve::server
