// SPDX-License-Identifier: Apache-2.0
// Batching must not change results: two prompts of different lengths prefilled in one forward step and then
// decoded together (M = 2 GEMMs, one attention per sequence) give the same greedy tokens as each prompt alone,
// and those match transformers' greedy goldens.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "backends/load_model.h"
#include "checkpoint/safetensors.h"
#include "test_support.h"

namespace fp4serve::model {
namespace {

using test_support::ids_of;

namespace fs = std::filesystem;

int32_t argmax_row(const std::vector<float>& logits, size_t row, int64_t vocab) {
  const float* p = logits.data() + row * static_cast<size_t>(vocab);
  return static_cast<int32_t>(std::max_element(p, p + vocab) - p);
}

class BatchInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariance, TwoPromptsInOneBatchDecodeAsTheyDoAlone) {
  const fs::path dir = fs::path(FP4SERVE_TEST_DATA) / "ref" / GetParam();
  LoadOptions options;
  const LoadedModel loaded = load_model(dir, options);
  const checkpoint::SafetensorsFile golden(dir / "golden.safetensors");
  const int64_t vocab = loaded.config.vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {ids_of(golden, "prompt0"), ids_of(golden, "prompt1")};
  ASSERT_NE(prompts[0].size(), prompts[1].size()) << "the test wants sequences of different lengths";
  constexpr int kSteps = 8;
  KvCache cache = loaded.decoder->make_cache(64, 2);

  // Each prompt alone.
  std::vector<std::vector<int32_t>> alone(2);
  for (size_t s = 0; s < 2; ++s) {
    const int slot = cache.acquire();
    SequenceChunk chunk{slot, 0, prompts[s], false};
    std::vector<float> logits = loaded.decoder->forward(std::span(&chunk, 1), cache);
    int64_t position = static_cast<int64_t>(prompts[s].size());
    for (int step = 0; step < kSteps; ++step) {
      alone[s].push_back(argmax_row(logits, 0, vocab));
      SequenceChunk next{slot, position++, std::span(&alone[s].back(), 1), false};
      logits = loaded.decoder->forward(std::span(&next, 1), cache);
    }
    cache.release(slot);
    EXPECT_EQ(alone[s], ids_of(golden, "greedy.prompt" + std::to_string(s)));
  }

  // Both in every step: one prefill of 14 + 16 tokens, then decode steps of M = 2.
  const int slots[2] = {cache.acquire(), cache.acquire()};
  std::vector<SequenceChunk> batch = {{slots[0], 0, prompts[0], false}, {slots[1], 0, prompts[1], false}};
  std::vector<float> logits = loaded.decoder->forward(batch, cache);
  std::vector<std::vector<int32_t>> together(2);
  int64_t positions[2] = {static_cast<int64_t>(prompts[0].size()), static_cast<int64_t>(prompts[1].size())};
  for (int step = 0; step < kSteps; ++step) {
    for (size_t s = 0; s < 2; ++s) together[s].push_back(argmax_row(logits, s, vocab));
    batch = {{slots[0], positions[0]++, std::span(&together[0].back(), 1), false},
             {slots[1], positions[1]++, std::span(&together[1].back(), 1), false}};
    logits = loaded.decoder->forward(batch, cache);
  }
  EXPECT_EQ(together[0], alone[0]);
  EXPECT_EQ(together[1], alone[1]);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchInvariance,
                         ::testing::Values("llama-nvfp4a16", "llama-mxfp4a16", "qwen2-nvfp4a16", "llama-w4a16"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string n = param_info.param;
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

}  // namespace
}  // namespace fp4serve::model
