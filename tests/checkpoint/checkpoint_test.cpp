// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "fp4serve/error.h"

namespace fp4serve::checkpoint {
namespace {

const std::string kSharded = std::string(FP4SERVE_TEST_DATA) + "/sharded-nvfp4";

TEST(Checkpoint, OpensAShardedFolderAndAgreesWithTheIndex) {
  const Checkpoint ckpt = Checkpoint::open(kSharded);
  EXPECT_EQ(ckpt.shards().size(), 2u);
  std::ifstream in(kSharded + "/model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  EXPECT_EQ(ckpt.tensor_names().size(), index["weight_map"].size());
  for (const auto& [name, shard] : index["weight_map"].items()) {
    const auto loc = ckpt.find(name);
    ASSERT_TRUE(loc.has_value()) << name;
    EXPECT_EQ(loc->shard->path().filename().string(), shard.get<std::string>()) << name;
  }
  EXPECT_EQ(ckpt.config()["architectures"][0], "LlamaForCausalLM");
  EXPECT_TRUE(ckpt.hf_quant_config().is_null());
}

TEST(Checkpoint, TensorViewsHaveTheHeaderShapeAndBytes) {
  const Checkpoint ckpt = Checkpoint::open(kSharded);
  const core::TensorView packed = ckpt.tensor("model.layers.0.self_attn.q_proj.weight_packed");
  EXPECT_EQ(packed.dtype, core::DType::U8);
  EXPECT_EQ(packed.shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(packed.bytes.size(), 64u * 32u);
  const core::TensorView gs = ckpt.tensor("model.layers.0.self_attn.q_proj.weight_global_scale");
  EXPECT_EQ(gs.shape, std::vector<int64_t>{1});
  // The generator draws amax in [0.05, 0.2], so 448·6/amax lies in [13440, 53760].
  EXPECT_GT(gs.load<float>(0), 13440.0f);
  EXPECT_LT(gs.load<float>(0), 53760.0f);
}

TEST(Checkpoint, MissingTensorErrorNamesCheckpointAndTensor) {
  const Checkpoint ckpt = Checkpoint::open(kSharded);
  try {
    ckpt.tensor("model.layers.7.mlp.up_proj.weight_packed");
    FAIL();
  } catch (const FormatError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("sharded-nvfp4"), std::string::npos) << m;
    EXPECT_NE(m.find("model.layers.7.mlp.up_proj.weight_packed"), std::string::npos) << m;
  }
}

TEST(Checkpoint, OpensASingleSafetensorsFile) {
  const Checkpoint ckpt = Checkpoint::open(std::string(FP4SERVE_TEST_DATA) + "/valid/scalar_and_empty.safetensors");
  EXPECT_EQ(ckpt.shards().size(), 1u);
  EXPECT_TRUE(ckpt.contains("scalar"));
  EXPECT_TRUE(ckpt.config().is_null());
}

}  // namespace
}  // namespace fp4serve::checkpoint
