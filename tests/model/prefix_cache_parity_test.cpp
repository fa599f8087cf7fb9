// SPDX-License-Identifier: Apache-2.0
// Automatic prefix caching must not change results: a prompt whose head another sequence already computed (and
// registered in the prefix cache) takes those blocks and computes only the rest, and its logits and greedy
// continuation must be those of a cold run on a cache without prefix caching. On the reference fixtures: dense
// (llama, W4A4 with per-row activation quantization), MoE (qwen3moe, mixtral) and gpt-oss, whose sliding layers
// (window 128) read across the shared blocks and whose attention has sinks. The prompts are longer than the
// window, so the suffix's window starts inside the cached prefix.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <span>
#include <vector>

#include "backends/load_model.h"

namespace fp4serve::model {
namespace prefix_cache_parity {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kSharedLen = 170;  // the first sequence's prompt: 10 full blocks of 16 and 10 positions
constexpr int64_t kPromptLen = 203;  // the second prompt: the first one then 33 new tokens
constexpr int kSteps = 8;            // greedy tokens compared
// The prefix-hit run reads the same cached keys and values as a cold run would have written, and only the
// suffix's rows go through the GEMMs; per-row arithmetic makes the two equal up to summation order. The bound is
// decoder_parity_test's for a bf16 source against transformers (1e-3 of max|logit|), tighter than any fixture's.
constexpr double kTolerance = 1e-3;

std::vector<int32_t> seeded_tokens(int64_t count, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> out(static_cast<size_t>(count));
  for (int32_t& t : out) t = d(rng);
  return out;
}

int32_t argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

struct CachedRun {
  std::vector<float> first_logits;  // the prompt's last-position logits
  std::vector<int32_t> greedy;      // kSteps greedy tokens after the prompt
};

// Prefills `prompt` from position `start` (what the slot already holds) and decodes kSteps greedy tokens.
CachedRun run_from(const ForwardModel& model, KvCache& cache, int slot, std::span<const int32_t> prompt, int64_t start) {
  CachedRun run;
  SequenceChunk chunk{slot, start, prompt.subspan(static_cast<size_t>(start)), false};
  run.first_logits = model.forward(std::span(&chunk, 1), cache);
  std::vector<float> logits = run.first_logits;
  auto position = static_cast<int64_t>(prompt.size());
  for (int step = 0; step < kSteps; ++step) {
    run.greedy.push_back(argmax(logits));
    SequenceChunk next{slot, position++, std::span(&run.greedy.back(), 1), false};
    logits = model.forward(std::span(&next, 1), cache);
  }
  return run;
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (const float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

class PrefixCacheParity : public ::testing::TestWithParam<std::string> {};

TEST_P(PrefixCacheParity, PrefixHitEqualsColdRun) {
  const fs::path dir = fs::path(FP4SERVE_TEST_DATA) / "ref" / GetParam();
  const LoadedModel loaded = load_model(dir, LoadOptions{});
  const ForwardModel& model = *loaded.decoder;
  const int64_t vocab = loaded.config.vocab_size;
  std::vector<int32_t> prompt = seeded_tokens(kPromptLen, vocab, 40);
  const std::span<const int32_t> shared = std::span<const int32_t>(prompt).first(kSharedLen);
  const int64_t max_len = kPromptLen + kSteps + 1;

  KvCache cold_cache = model.make_cache(max_len, 1);
  const int cold_slot = cold_cache.acquire();
  const CachedRun cold = run_from(model, cold_cache, cold_slot, prompt, 0);

  KvCache cache = model.make_cache(max_len, 3);
  cache.set_prefix_caching(true);
  const int64_t bs = cache.block_size();
  // The first sequence computes the shared head and registers its full blocks.
  const int first = cache.acquire();
  EXPECT_EQ(cache.match_prefix(first, shared), 0);
  SequenceChunk head{first, 0, shared, false};
  model.forward(std::span(&head, 1), cache);

  // While it still runs, the second finds its blocks and computes only the rest.
  const int second = cache.acquire();
  const int64_t hit = cache.match_prefix(second, prompt);
  EXPECT_EQ(hit, kSharedLen / bs * bs);
  for (int64_t i = 0; i < hit / bs; ++i) {
    EXPECT_EQ(cache.block_table(second)[static_cast<size_t>(i)], cache.block_table(first)[static_cast<size_t>(i)]);
  }
  const CachedRun warm = run_from(model, cache, second, prompt, hit);
  EXPECT_EQ(warm.greedy, cold.greedy);
  const double scale = max_abs(cold.first_logits);
  ASSERT_EQ(warm.first_logits.size(), cold.first_logits.size());
  EXPECT_LE(max_diff(warm.first_logits, cold.first_logits), kTolerance * scale)
      << "max|logit| " << scale << " (shared-prefix run)";

  // After both finished, a third run of the same prompt finds every full block of the second's prompt: its
  // decode positions wrote blocks of their own, so the hit stops at the prompt's last full block.
  cache.release(first);
  cache.release(second);
  const int third = cache.acquire();
  const int64_t rehit = cache.match_prefix(third, prompt);
  EXPECT_EQ(rehit, (kPromptLen - 1) / bs * bs);
  const CachedRun again = run_from(model, cache, third, prompt, rehit);
  EXPECT_EQ(again.greedy, cold.greedy);
  EXPECT_LE(max_diff(again.first_logits, cold.first_logits), kTolerance * scale)
      << "max|logit| " << scale << " (run after release)";
  cache.release(third);
  EXPECT_EQ(cache.free_blocks(), cache.num_blocks()) << "a block leaked";
  EXPECT_EQ(cache.prefix_cache_hits(), hit + rehit);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixCacheParity,
                         ::testing::Values("llama-nvfp4", "qwen3moe-nvfp4a16", "mixtral-nvfp4", "gptoss-mxfp4-native"),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           std::ranges::replace(name, '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace prefix_cache_parity
}  // namespace fp4serve::model
