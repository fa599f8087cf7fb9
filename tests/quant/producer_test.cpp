// SPDX-License-Identifier: Apache-2.0
#include "quant/producer.h"

#include <gtest/gtest.h>

#include "fp4serve/error.h"

namespace fp4serve::quant {
namespace {

using nlohmann::json;

TEST(Producer, CompressedTensorsCollectsGlobalAndGroupFormats) {
  const json config = {{"quantization_config",
                        {{"quant_method", "compressed-tensors"},
                         {"format", "mixed-precision"},
                         {"config_groups",
                          {{"g0", {{"format", "nvfp4-pack-quantized"}}}, {"g1", {{"format", "pack-quantized"}}}}}}}};
  const auto info = detect_producer(config, json());
  EXPECT_EQ(info.producer, Producer::CompressedTensors);
  EXPECT_EQ(info.formats, (std::vector<std::string>{"mixed-precision", "nvfp4-pack-quantized", "pack-quantized"}));
}

TEST(Producer, ModelOptByHfQuantConfigEvenWhenConfigLooksCompressedTensorsShaped) {
  const json hf = {{"producer", {{"name", "modelopt"}}},
                   {"quantization", {{"quant_algo", "MIXED_PRECISION"},
                                     {"quantized_layers", {{"a", {{"quant_algo", "NVFP4"}}},
                                                           {"b", {{"quant_algo", "FP8"}}}}}}}};
  const auto info = detect_producer(json::object(), hf);
  EXPECT_EQ(info.producer, Producer::ModelOpt);
  EXPECT_EQ(info.formats, (std::vector<std::string>{"MIXED_PRECISION", "NVFP4", "FP8"}));
  const json converted = {{"quantization_config", {{"quant_method", "modelopt"}, {"quant_algo", "W4A16_NVFP4"},
                                                   {"config_groups", json::object()}}}};
  EXPECT_EQ(detect_producer(converted, json()).producer, Producer::ModelOpt);
}

TEST(Producer, GptOssUnquantizedOtherAndBadConfigs) {
  EXPECT_EQ(detect_producer({{"quantization_config", {{"quant_method", "mxfp4"}}}}, json()).producer,
            Producer::GptOssMxfp4);
  EXPECT_EQ(detect_producer({{"architectures", {"LlamaForCausalLM"}}}, json()).producer, Producer::Unquantized);
  EXPECT_EQ(detect_producer({{"quantization_config", {{"quant_method", "awq"}}}}, json()).producer,
            Producer::OtherQuantized);
  EXPECT_THROW(detect_producer({{"quantization_config", 3}}, json()), FormatError);
  EXPECT_THROW(detect_producer({{"quantization_config", {{"format", "x"}}}}, json()), FormatError);
}

}  // namespace
}  // namespace fp4serve::quant
