// SPDX-License-Identifier: Apache-2.0
// load_model with the weight cache (LoadOptions::weight_cache): the load that writes the file, the load that maps
// it and a load without it give the same logits bit for bit (dense NVFP4, int4, block FP8, native MXFP4 MoE with
// biases, NVFP4 MoE, an online Hadamard); every layer of the second load comes from the file; a changed checkpoint
// file or --lm-head-dtype rewrites it; the GPU refuses `on`.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/load_model.h"
#include "fp4serve/error.h"
#include "test_support.h"

namespace fp4serve::model {
namespace {

using test_support::kRef;
namespace fs = std::filesystem;

std::vector<float> prompt_logits(const LoadedModel& loaded) {
  const std::vector<int32_t> ids{1, 17, 254, 3, 99, 42, 7};
  KvCache cache = loaded.decoder->make_cache(64, 1);
  const int slot = cache.acquire();
  SequenceChunk chunk{slot, 0, ids, true};
  return loaded.decoder->forward(std::span(&chunk, 1), cache);
}

class WeightCacheLoad : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const fs::path source = kRef / GetParam();
    if (!fs::exists(source / "config.json")) GTEST_SKIP() << source << " is not present";
    work_ = fs::temp_directory_path() / fmt::format("fp4serve-weight-cache-load-{}-{}", ::getpid(), GetParam());
    fs::remove_all(work_);
    fs::create_directories(work_ / "cache");
    model_ = work_ / GetParam();
    fs::copy(source, model_, fs::copy_options::recursive);  // a copy of its own: the test changes its files
  }
  void TearDown() override {
    if (!work_.empty()) fs::remove_all(work_);
  }
  LoadOptions options(WeightCacheMode mode) const {
    LoadOptions o;
    o.weight_cache = mode;
    o.weight_cache_dir = work_ / "cache";
    return o;
  }
  fs::path work_, model_;
};

TEST_P(WeightCacheLoad, MappedWeightsGiveTheSameLogits) {
  const std::vector<float> reference = prompt_logits(load_model(model_, options(WeightCacheMode::Off)));

  const LoadedModel writer = load_model(model_, options(WeightCacheMode::On));
  ASSERT_TRUE(writer.weight_cache);
  EXPECT_TRUE(writer.weight_cache->written) << writer.weight_cache->not_written;
  EXPECT_EQ(writer.weight_cache->layers_mapped, 0);
  EXPECT_GT(writer.weight_cache->layers_prepared, 0);
  EXPECT_EQ(prompt_logits(writer), reference);

  const LoadedModel reader = load_model(model_, options(WeightCacheMode::On));
  ASSERT_TRUE(reader.weight_cache);
  EXPECT_EQ(reader.weight_cache->not_used, "");
  EXPECT_EQ(reader.weight_cache->layers_prepared, 0) << "every layer from the file";
  EXPECT_EQ(reader.weight_cache->layers_mapped, writer.weight_cache->layers_prepared);
  EXPECT_FALSE(reader.weight_cache->written);
  EXPECT_EQ(prompt_logits(reader), reference);
  EXPECT_EQ(fs::file_size(reader.weight_cache->file), writer.weight_cache->bytes_written);

  // Another --lm-head-dtype is another key: the file is rewritten (one file per checkpoint, never two).
  LoadOptions fp8 = options(WeightCacheMode::On);
  fp8.lm_head_dtype = LmHeadDtype::Fp8;
  const LoadedModel requantized = load_model(model_, fp8);
  ASSERT_TRUE(requantized.weight_cache);
  EXPECT_NE(requantized.weight_cache->not_used.find("lm_head_dtype bf16"), std::string::npos)
      << requantized.weight_cache->not_used;
  EXPECT_TRUE(requantized.weight_cache->written);
  EXPECT_EQ(std::distance(fs::directory_iterator(work_ / "cache"), fs::directory_iterator()), 1);
}

TEST_P(WeightCacheLoad, AChangedCheckpointFileRewritesIt) {
  const std::vector<float> reference = prompt_logits(load_model(model_, options(WeightCacheMode::Off)));
  (void)load_model(model_, options(WeightCacheMode::On));
  fs::path shard;
  for (const auto& e : fs::directory_iterator(model_)) {
    if (e.path().extension() == ".safetensors" && e.path().filename() != "golden.safetensors") shard = e.path();
  }
  ASSERT_FALSE(shard.empty());
  fs::last_write_time(shard, fs::last_write_time(shard) + std::chrono::seconds(5));
  const LoadedModel again = load_model(model_, options(WeightCacheMode::On));
  ASSERT_TRUE(again.weight_cache);
  EXPECT_NE(again.weight_cache->not_used.find("file " + shard.filename().string()), std::string::npos)
      << again.weight_cache->not_used;
  EXPECT_EQ(again.weight_cache->layers_mapped, 0);
  EXPECT_TRUE(again.weight_cache->written);
  EXPECT_EQ(prompt_logits(again), reference);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, WeightCacheLoad,
                         ::testing::Values("llama-nvfp4a16", "llama-w4a16", "gptoss-mxfp4-native", "llama-quip-nvfp4a16",
                                           "qwen3moe-nvfp4a16", "llama-fp8-block"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

// Auto leaves small checkpoints alone (they load in well under a second), and nothing is written without a need.
TEST(WeightCacheLoadOptions, AutoSkipsSmallCheckpointsAndTheGpuRefusesOn) {
  const fs::path dir = kRef / "llama-nvfp4a16";
  if (!fs::exists(dir / "config.json")) GTEST_SKIP() << dir << " is not present";
  LoadOptions o;
  o.weight_cache = WeightCacheMode::Auto;
  o.weight_cache_dir = fs::temp_directory_path() / fmt::format("fp4serve-weight-cache-auto-{}", ::getpid());
  const LoadedModel loaded = load_model(dir, o);
  EXPECT_FALSE(loaded.weight_cache);
  EXPECT_FALSE(fs::exists(o.weight_cache_dir));
  o.weight_cache = WeightCacheMode::On;
  o.device = plan::DeviceChoice::Cuda;
  try {
    (void)load_model(dir, o);
    ADD_FAILURE() << "--weight-cache on was accepted for the GPU";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--weight-cache on"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp4serve::model
