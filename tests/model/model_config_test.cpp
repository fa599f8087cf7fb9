// SPDX-License-Identifier: Apache-2.0
// config.json → ModelConfig: the rope_theta the model runs with is the one kernels::parse_rope_theta (tested in
// tests/backends/cpu/kernels/ops_rope_test.cpp) reads, wherever the config puts it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fp4serve/error.h"
#include "model/model_config.h"

namespace fp4serve::model {
namespace {

nlohmann::json llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", 64}, {"intermediate_size", 96},
          {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
          {"vocab_size", 50}, {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 64}};
}

TEST(ModelConfig, RopeThetaDefaultsToTransformers10000) {
  EXPECT_EQ(parse_model_config(llama_config()).rope_theta, 10000.0);
}

TEST(ModelConfig, RopeThetaTopLevel) {
  nlohmann::json c = llama_config();
  c["rope_theta"] = 500000.0;
  EXPECT_EQ(parse_model_config(c).rope_theta, 500000.0);
}

// transformers v5 writes rope_theta inside "rope_parameters", which it also exposes as "rope_scaling"; the
// block's value wins over a stale top-level one.
TEST(ModelConfig, RopeThetaInsideTheRopeBlock) {
  nlohmann::json c = llama_config();
  c["rope_theta"] = 10000.0;
  c["rope_scaling"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  EXPECT_EQ(parse_model_config(c).rope_theta, 1000000.0);
  nlohmann::json p = llama_config();
  p["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};
  EXPECT_EQ(parse_model_config(p).rope_theta, 250000.0);
}

TEST(ModelConfig, RopeThetaThatIsNotANumberIsAFormatError) {
  nlohmann::json c = llama_config();
  c["rope_scaling"] = {{"rope_type", "default"}, {"rope_theta", "1e6"}};
  EXPECT_THROW(parse_model_config(c), FormatError);
}

}  // namespace
}  // namespace fp4serve::model
