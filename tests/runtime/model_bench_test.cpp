// SPDX-License-Identifier: Apache-2.0
// `bench model`: the statistics are checked against figures worked out by hand; the run itself on a tiny
// reference fixture (counts, interleaving, refusals).
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <vector>

#include "fp4serve/error.h"
#include "backends/load_model.h"
#include "runtime/model_bench.h"

namespace fp4serve::runtime {
namespace {

TEST(ModelBench, SummaryMediansSpreadsAndPerRepetitionRatios) {
  ModelBenchConfig config;
  config.prompt_tokens = 10;
  config.gen_tokens = 5;  // 4 timed decode steps
  // Model A decodes 4 steps in 1, 2, 4 s (4, 2, 1 tok/s); B in 2, 2, 2 s (2, 2, 2 tok/s).
  const std::vector<std::vector<ModelBenchSample>> samples = {
      {{0.5, 1.0}, {1.0, 2.0}, {2.0, 4.0}},
      {{1.0, 2.0}, {1.0, 2.0}, {1.0, 2.0}},
  };
  const std::vector<std::string> names = {"a", "b"};
  const auto rows = summarize_model_bench(names, samples, config);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_DOUBLE_EQ(rows[0].decode_tokens_per_s, 2.0);
  EXPECT_DOUBLE_EQ(rows[0].decode_min, 1.0);
  EXPECT_DOUBLE_EQ(rows[0].decode_max, 4.0);
  EXPECT_DOUBLE_EQ(rows[0].prefill_tokens_per_s, 10.0);  // 20, 10, 5 tok/s
  EXPECT_DOUBLE_EQ(rows[0].tpot_ms, 500.0);
  EXPECT_DOUBLE_EQ(rows[0].decode_vs_first, 1.0);
  // B / A per repetition: 2/4, 2/2, 2/1 → median 1, although B's median speed equals A's only by chance.
  EXPECT_DOUBLE_EQ(rows[1].decode_vs_first, 1.0);
  EXPECT_DOUBLE_EQ(rows[1].prefill_vs_first, 1.0);  // 10/20, 10/10, 10/5
  // A ratio taken per repetition differs from the ratio of medians when the machine drifts.
  const std::vector<std::vector<ModelBenchSample>> drift = {
      {{1, 1.0}, {1, 2.0}, {1, 4.0}},
      {{1, 1.1}, {1, 2.2}, {1, 4.4}},
  };
  const auto drifted = summarize_model_bench(names, drift, config);
  EXPECT_NEAR(drifted[1].decode_vs_first, 1.0 / 1.1, 1e-12);
  const std::vector<std::vector<ModelBenchSample>> uneven = {{{1, 1}}, {{1, 1}, {1, 1}}};
  EXPECT_THROW(summarize_model_bench(names, uneven, config), UsageError);
  const std::string table = format_model_bench(rows, config);
  EXPECT_NE(table.find("| a | 10.0 [5.0–20.0] | 2.00 [1.00–4.00] | 500.00 | 1.000 | 1.000 |"), std::string::npos) << table;
}

TEST(ModelBench, RunsEveryModelEveryRepetitionOnATinyFixture) {
  const std::filesystem::path dir = std::filesystem::path(FP4SERVE_TEST_DATA) / "ref" / "llama-nvfp4a16";
  model::LoadOptions options;
  const std::vector<ModelBenchTarget> targets = {{"x", dir, options}, {"y", dir, options}};
  ModelBenchConfig config;
  config.prompt_tokens = 7;
  config.gen_tokens = 3;
  config.repetitions = 3;
  std::vector<std::pair<size_t, int>> order;
  const auto samples = run_model_bench(targets, config, [&](size_t m, int r, const ModelBenchSample& s) {
    EXPECT_GT(s.prefill_seconds, 0.0);
    EXPECT_GT(s.decode_seconds, 0.0);
    order.emplace_back(m, r);
  });
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].size(), 3u);
  EXPECT_EQ(samples[1].size(), 3u);
  // The starting model rotates each repetition.
  const std::vector<std::pair<size_t, int>> want = {{0, 0}, {1, 0}, {1, 1}, {0, 1}, {0, 2}, {1, 2}};
  EXPECT_EQ(order, want);

  config.gen_tokens = 1;
  EXPECT_THROW(run_model_bench(targets, config), UsageError);
  config.gen_tokens = 3;
  config.prompt_tokens = model::parse_model_config(checkpoint::Checkpoint::open(dir).config()).max_position_embeddings;
  EXPECT_THROW(run_model_bench(targets, config), UsageError);
  EXPECT_THROW(run_model_bench({}, config), UsageError);
}

// Records the token count of every chunk that reaches the model.
class ChunkRecorder final : public model::ForwardModel {
 public:
  ChunkRecorder(const model::ForwardModel& inner, std::vector<int64_t>& chunks) : inner_(inner), chunks_(chunks) {}
  const model::ModelConfig& config() const override { return inner_.config(); }
  model::KvCache make_cache(const model::KvCacheSpec& spec) const override { return inner_.make_cache(spec); }
  std::vector<float> forward(std::span<const model::SequenceChunk> batch, model::KvCache& cache) const override {
    for (const model::SequenceChunk& c : batch) chunks_.push_back(static_cast<int64_t>(c.tokens.size()));
    return inner_.forward(batch, cache);
  }

 private:
  const model::ForwardModel& inner_;
  std::vector<int64_t>& chunks_;
};

// The warmup (llama-bench's default) runs untimed before each sample: a prompt of at most 32 tokens, one output
// token; --no-warmup leaves only the timed prompt and decode steps.
TEST(ModelBench, WarmsUpBeforeEachSampleUnlessTurnedOff) {
  const std::filesystem::path dir = std::filesystem::path(FP4SERVE_TEST_DATA) / "ref" / "llama-nvfp4a16";
  const std::vector<ModelBenchTarget> targets = {{"x", dir, model::LoadOptions{}}};
  std::vector<int64_t> chunks;
  const ModelBenchLoader recording = [&](size_t, const ModelBenchTarget& t) {
    BenchModel bench{model::load_model(t.dir, t.load), nullptr};
    bench.wrapper = std::make_unique<ChunkRecorder>(*bench.loaded.decoder, chunks);
    return bench;
  };
  ModelBenchConfig config;
  config.prompt_tokens = 40;
  config.gen_tokens = 3;
  config.repetitions = 2;
  run_model_bench(targets, config, {}, recording);
  // Per sample: the warmup's 32-token prompt, the 40-token prompt, two decode steps.
  EXPECT_EQ(chunks, (std::vector<int64_t>{32, 40, 1, 1, 32, 40, 1, 1}));
  chunks.clear();
  config.warmup = false;
  config.prompt_tokens = 5;
  run_model_bench(targets, config, {}, recording);
  EXPECT_EQ(chunks, (std::vector<int64_t>{5, 1, 1, 5, 1, 1}));
}

}  // namespace
}  // namespace fp4serve::runtime
