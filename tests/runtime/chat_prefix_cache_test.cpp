// SPDX-License-Identifier: Apache-2.0
// A chat's turns through generate() on one cache with prefix caching on, as `fp4serve chat` runs them: the second
// turn's prompt (the whole conversation rendered again with the fixture's ChatML template) finds the first turn's
// blocks, the model computes only the tokens after them (counted by a wrapper around the model), and the reply is
// the one a cold run of the whole conversation on a fresh cache gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backends/load_model.h"
#include "runtime/generator.h"
#include "runtime/text_setup.h"
#include "text/chat_template.h"

namespace fp4serve::runtime {
namespace chat_prefix_cache_test {
namespace {

namespace fs = std::filesystem;

// Counts the tokens each forward step computes.
class CountingModel : public model::ForwardModel {
 public:
  explicit CountingModel(const model::ForwardModel& inner) : inner_(inner) {}
  const model::ModelConfig& config() const override { return inner_.config(); }
  using model::ForwardModel::make_cache;
  model::KvCache make_cache(const model::KvCacheSpec& spec) const override { return inner_.make_cache(spec); }
  std::vector<float> forward(std::span<const model::SequenceChunk> batch, model::KvCache& cache) const override {
    if (steps_++ == 0) {
      for (const auto& c : batch) first_step_tokens_ += static_cast<int64_t>(c.tokens.size());
    }
    return inner_.forward(batch, cache);
  }
  /// Starts a new count: the next step is a prefill.
  void reset() const { steps_ = 0, first_step_tokens_ = 0; }
  int64_t prefill_tokens() const { return first_step_tokens_; }

 private:
  const model::ForwardModel& inner_;
  mutable int64_t steps_ = 0;
  mutable int64_t first_step_tokens_ = 0;
};

TEST(ChatPrefixCache, SecondTurnComputesOnlyItsNewTokensAndRepliesAsAColdRun) {
  const fs::path dir = fs::path(FP4SERVE_TEST_DATA) / "ref" / "llama-nvfp4a16";
  const model::LoadedModel loaded = model::load_model(dir, model::LoadOptions{});
  const text::Tokenizer tokenizer = load_tokenizer(loaded.checkpoint);
  const text::ChatTemplate tmpl = text::ChatTemplate::from_tokenizer_config(loaded.checkpoint.tokenizer_config());
  const nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  const CountingModel model(*loaded.decoder);
  constexpr int64_t kMaxLen = 256;
  model::KvCache cache = model.make_cache(kMaxLen, 1);
  cache.set_prefix_caching(true);
  const int64_t bs = cache.block_size();

  auto ask = [&](model::KvCache& c, const nlohmann::ordered_json& history) {
    GenerationRequest request;
    request.prompt = tokenizer.encode(tmpl.render_messages(history, true, variables), false);
    request.sampling.temperature = 0.0f;
    request.max_new_tokens = 12;
    request.ignore_eos = true;
    model.reset();
    GenerationResult r = generate(model, c, tokenizer, request, [](std::string_view) { return true; });
    EXPECT_EQ(model.prefill_tokens(), r.prompt_tokens - r.cached_tokens);
    return std::make_pair(request.prompt, r);
  };
  nlohmann::ordered_json history = nlohmann::ordered_json::array();
  history.push_back({{"role", "system"},
                     {"content", "You are a careful assistant. Answer every question about the license in one "
                                 "sentence, quoting the section it comes from."}});
  history.push_back({{"role", "user"}, {"content", "What does the license say about patents?"}});
  const auto [prompt1, turn1] = ask(cache, history);
  EXPECT_EQ(turn1.cached_tokens, 0);
  ASSERT_EQ(turn1.tokens.size(), 12u);

  history.push_back({{"role", "assistant"}, {"content", turn1.text}});
  history.push_back({{"role", "user"}, {"content", "And about trademarks?"}});
  const auto [prompt2, turn2] = ask(cache, history);
  // The cache holds the first turn's prompt and reply but its last token (never run through the model); the
  // second prompt reuses the full blocks of the longest common prefix, short of its own last token.
  std::vector<int32_t> held = prompt1;
  held.insert(held.end(), turn1.tokens.begin(), turn1.tokens.end() - 1);
  const auto common = static_cast<int64_t>(
      std::ranges::mismatch(held, prompt2).in1 - held.begin());
  const int64_t want_hit = std::min(common, static_cast<int64_t>(prompt2.size()) - 1) / bs * bs;
  EXPECT_GE(want_hit, static_cast<int64_t>(prompt1.size()) / bs * bs) << "the first turn's prompt is not reused";
  EXPECT_EQ(turn2.cached_tokens, want_hit);
  EXPECT_EQ(model.prefill_tokens(), static_cast<int64_t>(prompt2.size()) - want_hit);
  EXPECT_LT(model.prefill_tokens(), static_cast<int64_t>(prompt2.size()) / 2);

  // A cold run of the whole conversation.
  model::KvCache cold = model.make_cache(kMaxLen, 1);
  const auto [cold_prompt, cold_turn2] = ask(cold, history);
  EXPECT_EQ(cold_prompt, prompt2);
  EXPECT_EQ(cold_turn2.cached_tokens, 0);
  EXPECT_EQ(model.prefill_tokens(), static_cast<int64_t>(prompt2.size()));
  EXPECT_EQ(turn2.tokens, cold_turn2.tokens);
  EXPECT_EQ(turn2.text, cold_turn2.text);
  EXPECT_EQ(cache.free_blocks(), cache.num_blocks()) << "a block is still held after the turns";
}

}  // namespace
}  // namespace chat_prefix_cache_test
}  // namespace fp4serve::runtime
