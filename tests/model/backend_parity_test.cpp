// SPDX-License-Identifier: Apache-2.0
// The same model::Decoder on two backends: CudaBackend against CpuBackend (the oracle, itself matched to
// transformers in decoder_parity_test.cpp and moe_test.cpp) on every dense and MoE reference fixture, online
// transforms (QuIP / SpinQuant) included: logits of the two golden prompts within 2e-2 · max|logit| (set by the
// GPU's bf16 GEMM inputs), then 8 teacher-forced greedy decode steps through the KV cache (the GPU is fed the
// CPU's tokens; the decode steps run split-KV attention and, for dense models, CUDA graphs) with their logits in
// the same bound and the near-tie rule of backends/cuda/kernels/greedy_check.h: a different argmax fails only when the
// CPU prefers its token by more than 1e-3 · max|logit| (the margin is printed either way). CudaGraphs checks graph
// replay against eager decode steps of the same backend; CudaPrefixCache a prefix-cache hit against a cold run on the
// GPU. The GPU cases skip without a GPU; the host-side checks
// (batch flattening, cache ownership, the no-GPU refusal) run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "backends/cpu/cpu_kv_storage.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/device.h"
#include "backends/cuda/kernels/greedy_check.h"
#include "backends/load_model.h"
#include "checkpoint/safetensors.h"
#include "fp4serve/error.h"
#include "model/backend.h"
#include "test_support.h"

namespace fp4serve::model {
namespace {

using backends::cpu::host_kv;
using backends::cuda::CudaBackend;
using test_support::ids_of;
using test_support::kRef;

namespace fs = std::filesystem;

bool have_gpu() { return kernels::cuda::cuda_device(0).has_value(); }

TEST(BackendHost, FlattenBatchComputesRowsAndRejectsBadChunks) {
  const std::vector<int32_t> a = {5, 6, 7}, b = {9};
  // 3 layers, blocks of 4 positions: slot 2's positions 4 … 6 need its blocks 0 and 1, slot 0's position 10 blocks
  // 0 … 2, slot 1's 0 … 2 block 0; blocks are handed out in chunk order.
  KvCache cache(3, 1, 4, KvCacheSpec{16, 4, 32, 4});
  const std::vector<SequenceChunk> batch = {{2, 4, a, false}, {0, 10, b, false}, {1, 0, a, true}};
  const FlatBatch flat = flatten_batch(batch, cache, /*vocab=*/10);
  EXPECT_EQ(flat.ids, (std::vector<int32_t>{5, 6, 7, 9, 5, 6, 7}));
  EXPECT_EQ(flat.positions, (std::vector<int64_t>{4, 5, 6, 10, 0, 1, 2}));
  EXPECT_EQ(flat.slots, (std::vector<int>{2, 2, 2, 0, 1, 1, 1}));
  EXPECT_EQ(cache.block_table(2).size(), 2u);
  EXPECT_EQ(cache.block_table(0).size(), 3u);
  // block · layers · block_size + position % block_size
  const auto row = [&](int slot, int64_t pos) {
    return static_cast<int64_t>(cache.block_table(slot)[static_cast<size_t>(pos / 4)]) * 12 + pos % 4;
  };
  EXPECT_EQ(flat.cache_rows, (std::vector<int64_t>{row(2, 4), row(2, 5), row(2, 6), row(0, 10), row(1, 0), row(1, 1),
                                                   row(1, 2)}));
  EXPECT_EQ(flat.logit_rows, (std::vector<int64_t>{2, 3, 4, 5, 6}));
  // first_logit_row skips the first rows of an all_logits chunk.
  const std::vector<SequenceChunk> tail = {{1, 0, a, true, 1}, {0, 10, b, false}, {2, 0, a, true, 2}};
  EXPECT_EQ(flatten_batch(tail, cache, 10).logit_rows, (std::vector<int64_t>{1, 2, 3, 6}));

  const std::vector<int32_t> none;
  const std::vector<int32_t> big = {10};
  EXPECT_THROW(flatten_batch(std::vector<SequenceChunk>{{0, 0, none, false}}, cache, 10), UsageError);
  EXPECT_THROW(flatten_batch(std::vector<SequenceChunk>{{0, 14, a, false}}, cache, 10), UsageError);
  EXPECT_THROW(flatten_batch(std::vector<SequenceChunk>{{4, 0, a, false}}, cache, 10), UsageError);
  EXPECT_THROW(flatten_batch(std::vector<SequenceChunk>{{1, 0, a, false}, {1, 3, b, false}}, cache, 10), UsageError);
  EXPECT_THROW(flatten_batch(std::vector<SequenceChunk>{{0, 0, big, false}}, cache, 10), UsageError);
  EXPECT_THROW(flatten_batch(std::vector<SequenceChunk>{{0, 0, a, true, 3}}, cache, 10), UsageError);
  EXPECT_THROW(flatten_batch(std::vector<SequenceChunk>{{0, 0, a, true, -1}}, cache, 10), UsageError);
  // A pool without the blocks a step needs.
  KvCache small(3, 1, 4, KvCacheSpec{16, 2, 3, 4});
  const std::vector<int32_t> twelve(12, 1);
  EXPECT_NO_THROW(flatten_batch(std::vector<SequenceChunk>{{0, 0, twelve, false}}, small, 10));
  EXPECT_THROW(flatten_batch(std::vector<SequenceChunk>{{1, 0, a, false}}, small, 10), UsageError);
}

struct OpaqueStorage final : KvStorage {};

TEST(BackendHost, BackendCacheRefusesHostAccessAndTheCpuBackend) {
  KvCache cache(2, 1, 4, KvCacheSpec{8, 1}, std::make_unique<OpaqueStorage>());
  const int slot = cache.acquire();
  ASSERT_EQ(slot, 0);
  ASSERT_TRUE(cache.reserve(slot, 1));
  EXPECT_THROW(backends::cpu::host_key(cache, slot, 0, 0, 0), UsageError);
  EXPECT_THROW(backends::cpu::host_value(cache, slot, 0, 0, 0), UsageError);

  LoadOptions options;
  const LoadedModel cpu = load_model(kRef / "llama-nvfp4a16", options);
  KvCache foreign(cpu.config.num_layers, cpu.config.num_kv_heads, cpu.config.head_dim, KvCacheSpec{8, 1},
                  std::make_unique<OpaqueStorage>());
  const std::vector<int32_t> ids = {1, 2};
  const SequenceChunk chunk{foreign.acquire(), 0, ids, false};
  EXPECT_THROW(cpu.decoder->forward(std::span(&chunk, 1), foreign), UsageError);
}

// Every architecture reaches the backend: without a GPU, --device cuda stops at the no-GPU message (before any
// weight is read), for MoE and sinks models too, not at a per-architecture refusal.
TEST(BackendHost, DeviceCudaWithoutAGpuGivesTheNoGpuMessageForEveryArchitecture) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present: the no-GPU refusal cannot be observed here";
  LoadOptions options;
  options.device = plan::DeviceChoice::Cuda;
  for (const char* fixture : {"llama-nvfp4a16", "qwen3moe-nvfp4", "gptoss-mxfp4-native", "llama-spinquant-r3-nvfp4a16"}) {
    SCOPED_TRACE(fixture);
    try {
      load_model(kRef / fixture, options);
      FAIL() << "expected an error without a GPU";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA device was found"), std::string::npos) << e.what();
    }
  }
}

// Prefill with all logits, then `steps` decode steps through the cache. With `forced` empty each step feeds the
// argmax of the previous logits (the reference run); otherwise forced[s] (teacher forcing: the candidate is fed
// the reference's tokens). step_logits[s] are the logits that choose token s.
struct Trace {
  std::vector<float> prefill;
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> step_logits;
};
Trace run_model(const ForwardModel& model, const std::vector<int32_t>& ids, int steps,
                const std::vector<int32_t>& forced = {}) {
  KvCache cache = model.make_cache(64, 2);
  const int slot = cache.acquire();
  cache.release(slot);
  const int used = cache.acquire();  // the same slot again: stale contents must not matter
  Trace r;
  const SequenceChunk chunk{used, 0, ids, true};
  r.prefill = model.forward(std::span(&chunk, 1), cache);
  const int64_t vocab = model.config().vocab_size;
  std::vector<float> last(r.prefill.end() - vocab, r.prefill.end());
  auto position = static_cast<int64_t>(ids.size());
  for (int s = 0; s < steps; ++s) {
    r.step_logits.push_back(last);
    r.tokens.push_back(forced.empty() ? testing::argmax_of(last) : forced[static_cast<size_t>(s)]);
    const SequenceChunk next{used, position++, std::span(&r.tokens.back(), 1), false};
    last = model.forward(std::span(&next, 1), cache);
  }
  return r;
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

class BackendParity : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendParity, CudaBackendMatchesTheCpuBackend) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  const fs::path dir = kRef / GetParam();
  if (!fs::exists(dir / "golden.safetensors")) GTEST_SKIP() << dir << " is not in this checkout";
  LoadOptions options;
  options.kv_cache_dtype = KvCacheDtype::F32;  // the GPU's cache: the CPU oracle must not differ by a 16-bit cache's rounding
  const LoadedModel cpu = load_model(dir, options);
  options.device = plan::DeviceChoice::Cuda;
  const LoadedModel gpu = load_model(dir, options);
  ASSERT_EQ(gpu.decoder->backend().name().rfind("cuda", 0), 0u);
  const checkpoint::SafetensorsFile golden(dir / "golden.safetensors");
  constexpr double kBound = 2e-2;
  for (const std::string prompt : {"prompt0", "prompt1"}) {
    SCOPED_TRACE(prompt);
    const std::vector<int32_t> ids = ids_of(golden, prompt);
    const Trace want = run_model(*cpu.decoder, ids, 8);
    const Trace got = run_model(*gpu.decoder, ids, 8, want.tokens);
    ASSERT_EQ(got.prefill.size(), want.prefill.size());
    const double max_ref = max_abs(want.prefill);
    const double max_diff = max_abs_diff(got.prefill, want.prefill);
    // The GPU GEMMs read bf16 activations (relative rounding ≤ 2^-8 per element) where the CPU reads fp32: the
    // bound is the CPU path's own bound against transformers (2e-2 · max|logit|, decoder_parity_test.cpp).
    EXPECT_LE(max_diff, kBound * max_ref) << "max|Δ| = " << max_diff << ", max|logit| = " << max_ref;
    std::ostringstream rel;
    rel << std::scientific << std::setprecision(2) << max_diff / max_ref;
    RecordProperty(prompt + "_max_rel_diff", rel.str());
    std::vector<testing::GreedyStep> steps;
    double decode_rel = 0.0;
    for (size_t s = 0; s < want.step_logits.size(); ++s) {
      const std::vector<float>& w = want.step_logits[s];
      const double d = max_abs_diff(got.step_logits[s], w);
      decode_rel = std::max(decode_rel, d / max_abs(w));
      EXPECT_LE(d, kBound * max_abs(w)) << "decode step " << s << ": max|Δ| = " << d;
      steps.push_back(testing::compare_greedy_step(w, got.step_logits[s]));
    }
    const testing::GreedySummary greedy = testing::summarize_greedy(steps);
    std::cout << "[cuda-parity] " << GetParam() << " " << prompt << " max|dlogit|/max|logit| = " << rel.str()
              << " (prefill), " << std::scientific << std::setprecision(2) << decode_rel << " (decode); greedy "
              << greedy.agreed << "/" << steps.size() << " agree, " << greedy.ties << " near ties, " << greedy.failed
              << " fail (worst margin " << greedy.worst_relative_margin << " of max|logit|)\n"
              << greedy.report;
    EXPECT_EQ(greedy.failed, 0) << greedy.report;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, BackendParity,
    ::testing::Values("llama-bf16", "llama-nvfp4a16", "llama-mxfp4a16", "llama-nvfp4", "llama-mxfp4",
                      "llama-modelopt-w4a16-nvfp4", "llama-modelopt-nvfp4", "llama-i352-nvfp4", "qwen2-nvfp4a16",
                      "qwen3-nvfp4a16", "granite-nvfp4a16", "llama-quip-nvfp4a16", "llama-quiprh-nvfp4a16",
                      "llama-quipuv-nvfp4a16", "llama-quip-mxfp4a16", "llama-spinquant-nvfp4a16",
                      "llama-spinquant-r3-nvfp4a16", "mixtral-bf16", "mixtral-nvfp4a16", "mixtral-mxfp4a16",
                      "qwen3moe-bf16", "qwen3moe-nvfp4a16", "qwen3moe-mxfp4a16", "qwen3moe-nvfp4", "granitemoe-bf16",
                      "granitemoe-nvfp4a16", "granitemoe-mxfp4a16", "gptoss-mxfp4-native"),
    [](const auto& fixture) {
      std::string name = fixture.param;
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

CudaBackend& cuda_of(const LoadedModel& m) { return dynamic_cast<CudaBackend&>(m.decoder->backend()); }

// Decode steps of `rows` sequences (slots[0 … rows)), each fed its own token; returns the logits.
std::vector<float> decode_step(const ForwardModel& model, KvCache& cache, const std::vector<int>& slots,
                               std::vector<int64_t>& positions, const std::vector<int32_t>& tokens) {
  std::vector<SequenceChunk> batch;
  for (size_t i = 0; i < slots.size(); ++i) {
    batch.push_back({slots[i], positions[i]++, std::span(&tokens[i], 1), false});
  }
  return model.forward(batch, cache);
}

// The same backend with graphs on (captured once per bucket, then replayed) and off (every step eager) over one
// scenario: 4 sequences of different lengths decoding together (bucket 4, no padding), then 3 (bucket 4, one
// padding row on the scratch slot), then 1 (bucket 1); a longer prefill in between grows the workspaces (every
// graph then holds a freed address and must be dropped), and a second cache replaces the first (the graphs
// hold its keys' address). Replays read the new token, position and cache rows of each step from the copied
// step arrays; a stale graph would compute a step of the past (or read freed memory) and be far off. Steps whose
// batch fills the bucket run the same launches in both modes (expected bitwise, checked to 1e-5 · max|logit|);
// padded steps run another attention split count than the eager 3-row step (1e-3).
class CudaGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGraphs, ReplayedDecodeStepsMatchEagerOnes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  const fs::path dir = kRef / GetParam();
  if (!fs::exists(dir / "config.json")) GTEST_SKIP() << dir << " is not in this checkout";
  LoadOptions options;
  options.device = plan::DeviceChoice::Cuda;
  const LoadedModel graphed = load_model(dir, options);
  const LoadedModel eager = load_model(dir, options);
  cuda_of(graphed).set_graphs(true);
  cuda_of(eager).set_graphs(false);
  const int64_t vocab = graphed.config.vocab_size;
  int bitwise = 0, compared = 0;

  for (int round = 0; round < 2; ++round) {  // round 1: a new cache (new key/value addresses)
    SCOPED_TRACE(::testing::Message() << "cache " << round);
    KvCache gc = graphed.decoder->make_cache(96, 5);
    KvCache ec = eager.decoder->make_cache(96, 5);
    std::vector<int> slots;
    std::vector<int64_t> positions;
    std::vector<int32_t> tokens;
    for (int i = 0; i < 4; ++i) {
      const int slot = gc.acquire();
      ASSERT_EQ(slot, ec.acquire());
      std::vector<int32_t> prompt;
      for (int t = 0; t < 3 + 5 * i + round; ++t) {
        prompt.push_back(static_cast<int32_t>((17 * t + 101 * i + 7) % vocab));
      }
      const SequenceChunk chunk{slot, 0, prompt, false};
      const std::vector<float> a = graphed.decoder->forward(std::span(&chunk, 1), gc);
      const std::vector<float> b = eager.decoder->forward(std::span(&chunk, 1), ec);
      ASSERT_EQ(a, b) << "prefill is eager in both";
      slots.push_back(slot);
      positions.push_back(static_cast<int64_t>(prompt.size()));
      tokens.push_back(testing::argmax_of(a));
    }
    const auto steps = [&](int count, size_t rows, double tolerance) {
      std::vector<int> s(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(rows));
      std::vector<int64_t> pe(positions.begin(), positions.begin() + static_cast<std::ptrdiff_t>(rows));
      std::vector<int32_t> t(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(rows));
      for (int i = 0; i < count; ++i) {
        std::vector<int64_t> pg = pe;
        const std::vector<float> a = decode_step(*graphed.decoder, gc, s, pg, t);
        const std::vector<float> b = decode_step(*eager.decoder, ec, s, pe, t);
        ASSERT_EQ(a.size(), rows * static_cast<size_t>(vocab));
        const double d = max_abs_diff(a, b);
        EXPECT_LE(d, tolerance * max_abs(b)) << rows << " rows, step " << i;
        bitwise += a == b ? 1 : 0;
        ++compared;
        for (size_t r = 0; r < rows; ++r) {  // both fed the eager run's tokens
          t[r] = testing::argmax_of(std::span(b).subspan(r * static_cast<size_t>(vocab), static_cast<size_t>(vocab)));
        }
      }
      std::copy(pe.begin(), pe.end(), positions.begin());
      std::copy(t.begin(), t.end(), tokens.begin());
    };
    steps(6, 4, 1e-5);
    steps(5, 3, 1e-3);
    steps(5, 1, 1e-5);
    // A longer prefill on the free slot grows every workspace: graphs captured before must go.
    const int extra = gc.acquire();
    ASSERT_EQ(extra, ec.acquire());
    std::vector<int32_t> long_prompt(80);
    for (size_t t = 0; t < long_prompt.size(); ++t) long_prompt[t] = static_cast<int32_t>((31 * t + 5) % vocab);
    const SequenceChunk chunk{extra, 0, long_prompt, true};
    ASSERT_EQ(graphed.decoder->forward(std::span(&chunk, 1), gc), eager.decoder->forward(std::span(&chunk, 1), ec));
    steps(4, 4, 1e-5);
    steps(3, 1, 1e-5);
  }
  const CudaBackend::GraphStats g = cuda_of(graphed).graph_stats();
  const CudaBackend::GraphStats e = cuda_of(eager).graph_stats();
  std::cout << "[cuda-graphs] " << GetParam() << ": " << g.captures << " captures, " << g.replays << " replays, "
            << g.resets << " resets, " << g.eager << " eager; " << bitwise << "/" << compared
            << " steps bitwise equal to eager" << (g.capture_error.empty() ? "" : "; capture error: ")
            << g.capture_error << "\n";
  EXPECT_TRUE(g.capture_error.empty()) << g.capture_error;
  EXPECT_GE(g.captures, 4) << "buckets 4 and 1, captured again after each reset";
  EXPECT_GE(g.replays, 2 * (6 + 5 + 5 + 4 + 3) - 2 * 8) << "most steps replay";
  EXPECT_GE(g.resets, 2) << "the longer prefill and the new cache drop the graphs";
  EXPECT_EQ(e.captures + e.replays, 0);
  EXPECT_EQ(e.eager, 2 * (6 + 5 + 5 + 4 + 3));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGraphs,
                         ::testing::Values("llama-nvfp4a16", "qwen3-nvfp4a16", "granite-nvfp4a16", "llama-nvfp4",
                                           "llama-quip-nvfp4a16", "llama-bf16"),
                         [](const auto& fixture) {
                           std::string name = fixture.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// MoE models decode through split-KV attention too, but eagerly (routing runs on the host).
TEST(CudaGraphsMoe, MoeDecodeStepsRunEagerly) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  LoadOptions options;
  options.device = plan::DeviceChoice::Cuda;
  const LoadedModel moe = load_model(kRef / "qwen3moe-nvfp4a16", options);
  KvCache cache = moe.decoder->make_cache(32, 1);
  const std::vector<int32_t> prompt = {5, 9, 2};
  const SequenceChunk chunk{cache.acquire(), 0, prompt, false};
  moe.decoder->forward(std::span(&chunk, 1), cache);
  std::vector<int64_t> positions = {3};
  for (int i = 0; i < 3; ++i) decode_step(*moe.decoder, cache, {chunk.slot}, positions, {prompt[0]});
  const CudaBackend::GraphStats g = cuda_of(moe).graph_stats();
  EXPECT_EQ(g.captures + g.replays, 0);
  EXPECT_EQ(g.eager, 3);
}

// Layouts without a CUDA GEMM are refused at load, naming the op and the module.
TEST(BackendRefusals, Int4AndFp8LinearsNameTheOpAndTheModule) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  LoadOptions options;
  options.device = plan::DeviceChoice::Cuda;
  for (const char* fixture : {"llama-w4a16", "llama-fp8-dynamic"}) {
    SCOPED_TRACE(fixture);
    try {
      load_model(kRef / fixture, options);
      FAIL() << "accepted";
    } catch (const UnsupportedError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("op linear"), std::string::npos) << what;
      EXPECT_NE(what.find("model.layers.0."), std::string::npos) << what;
    }
  }
}


// A prefix-cache hit on the GPU: a 203-token prompt whose first 160 positions another sequence computed (and still
// holds) prefills only its last 43 tokens through the paged attention kernels, then decodes 8 steps teacher-forced
// by a cold run of the whole prompt on a cache without prefix caching. Logits within the file's bound, greedy
// tokens by the near-tie rule. gpt-oss: sliding layers (window 128) read across the shared blocks, and sinks.
class CudaPrefixCache : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaPrefixCache, PrefixHitMatchesAColdRun) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  const fs::path dir = kRef / GetParam();
  if (!fs::exists(dir / "config.json")) GTEST_SKIP() << dir << " is not in this checkout";
  LoadOptions options;
  options.device = plan::DeviceChoice::Cuda;
  const LoadedModel loaded = load_model(dir, options);
  const Decoder& model = *loaded.decoder;
  const int64_t vocab = loaded.config.vocab_size;
  constexpr int64_t kShared = 170, kPrompt = 203, kSteps = 8;
  std::vector<int32_t> prompt;
  for (int64_t t = 0; t < kPrompt; ++t) prompt.push_back(static_cast<int32_t>((37 * t + 11) % vocab));
  const std::span<const int32_t> whole(prompt);

  KvCache cold_cache = model.make_cache(kPrompt + kSteps + 1, 1);
  const int cold_slot = cold_cache.acquire();
  KvCache cache = model.make_cache(kPrompt + kSteps + 1, 2);
  cache.set_prefix_caching(true);
  const int first = cache.acquire();
  const SequenceChunk head{first, 0, whole.first(kShared), false};
  model.forward(std::span(&head, 1), cache);
  const int second = cache.acquire();
  const int64_t hit = cache.match_prefix(second, prompt);
  ASSERT_EQ(hit, kShared / cache.block_size() * cache.block_size());

  const SequenceChunk cold_chunk{cold_slot, 0, whole, false};
  std::vector<float> want = model.forward(std::span(&cold_chunk, 1), cold_cache);
  const SequenceChunk warm_chunk{second, hit, whole.subspan(static_cast<size_t>(hit)), false};
  std::vector<float> got = model.forward(std::span(&warm_chunk, 1), cache);
  std::vector<testing::GreedyStep> greedy;
  double worst = 0.0;
  for (int64_t step = 0;; ++step) {
    ASSERT_EQ(got.size(), want.size());
    worst = std::max(worst, max_abs_diff(got, want) / max_abs(want));
    EXPECT_LE(max_abs_diff(got, want), 2e-2 * max_abs(want)) << "step " << step;
    greedy.push_back(testing::compare_greedy_step(want, got));
    if (step == kSteps) break;
    const int32_t token = greedy.back().want;  // both fed the cold run's token
    const SequenceChunk c{cold_slot, kPrompt + step, std::span(&token, 1), false};
    want = model.forward(std::span(&c, 1), cold_cache);
    const SequenceChunk w{second, kPrompt + step, std::span(&token, 1), false};
    got = model.forward(std::span(&w, 1), cache);
  }
  const testing::GreedySummary summary = testing::summarize_greedy(greedy);
  std::cout << GetParam() << ": prefix hit " << hit << " of " << kPrompt << ", worst " << worst
            << " of max|logit|, " << summary.agreed << " greedy tokens agree\n" << summary.report;
  EXPECT_EQ(summary.failed, 0) << summary.report;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaPrefixCache, ::testing::Values("llama-nvfp4a16", "gptoss-mxfp4-native"),
                         [](const auto& fixture) {
                           std::string name = fixture.param;
                           std::ranges::replace(name, '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace fp4serve::model
