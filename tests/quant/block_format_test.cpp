// SPDX-License-Identifier: Apache-2.0
// The block-format rows against facts written out here from the format definitions (NVIDIA's NVFP4: E2M1 with an
// E4M3 scale per 16 and an fp32 tensor scale; OCP MX v1.0 MXFP4: E2M1 with an E8M0 scale per 32) and the
// llm-compressor preset definitions (compressed-tensors `quant_scheme.py`), not from the table itself.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "quant/block_format.h"
#include "quant/quant_config.h"

namespace fp4serve::quant {
namespace {

using nlohmann::json;

struct Expected {
  BlockFormat format;
  const char* name;
  int64_t group;
  bool global;
  double bits_per_weight;
  const char* ct_format;
  Strategy strategy;
  Dynamic input_dynamic;
};

constexpr Expected kExpected[] = {
    {BlockFormat::Nvfp4, "NVFP4", 16, true, 4.5, "nvfp4-pack-quantized", Strategy::TensorGroup, Dynamic::Local},
    {BlockFormat::Mxfp4, "MXFP4", 32, false, 4.25, "mxfp4-pack-quantized", Strategy::Group, Dynamic::Dynamic},
};

TEST(BlockFormat, RowsStateTheFormatDefinitions) {
  ASSERT_EQ(kBlockFormats.size(), std::size(kExpected));
  for (const Expected& e : kExpected) {
    const BlockFormatTraits& t = block_format_traits(e.format);
    SCOPED_TRACE(e.name);
    EXPECT_EQ(t.name, e.name);
    EXPECT_EQ(t.element, ElementFormat::E2M1);
    EXPECT_EQ(t.group_size, e.group);
    EXPECT_EQ(t.global_scale, e.global);
    EXPECT_DOUBLE_EQ(t.bits_per_weight(), e.bits_per_weight);
    EXPECT_EQ(t.packed_bytes_per_group(), e.group / 2);
    EXPECT_EQ(t.ct_format, e.ct_format);
    EXPECT_EQ(t.strategy, e.strategy);
    EXPECT_EQ(t.input_dynamic, e.input_dynamic);
    EXPECT_EQ(block_format_of(t.storage), e.format);
  }
  EXPECT_EQ(block_format_of(StorageFormat::GptOssMxfp4Blocks), BlockFormat::Mxfp4);
  EXPECT_FALSE(block_format_of(StorageFormat::Dense).has_value());
  EXPECT_FALSE(block_format_of(StorageFormat::IntPacked).has_value());
  EXPECT_FALSE(block_format_of(StorageFormat::Mxfp8).has_value());  // parsed, not a block format fp4serve runs
}

TEST(BlockFormat, ScaleDecodeFollowsTheScaleElement) {
  // E4M3: bias 7, 3 mantissa bits, subnormals below 2^-6, 0x7F NaN. E8M0: 2^(b-127), 255 → +inf.
  EXPECT_EQ(decode_block_scale(BlockFormat::Nvfp4, 0x38), 1.0f);
  EXPECT_EQ(decode_block_scale(BlockFormat::Nvfp4, 0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(decode_block_scale(BlockFormat::Nvfp4, 0x7E), 448.0f);
  EXPECT_EQ(decode_block_scale(BlockFormat::Nvfp4, 0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(decode_block_scale(BlockFormat::Nvfp4, 0x7F)));
  EXPECT_EQ(decode_block_scale(BlockFormat::Mxfp4, 127), 1.0f);
  EXPECT_EQ(decode_block_scale(BlockFormat::Mxfp4, 130), 8.0f);
  EXPECT_EQ(decode_block_scale(BlockFormat::Mxfp4, 0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isinf(decode_block_scale(BlockFormat::Mxfp4, 255)));
}

TEST(BlockFormat, VisitGivesEachFormatItsOwnTemplateArgument) {
  std::set<int64_t> groups;
  for (const BlockFormatTraits& t : kBlockFormats) {
    const int64_t g = visit_block_format(t.format, []<BlockFormat F>() { return block_format_traits(F).group_size; });
    EXPECT_EQ(g, t.group_size);
    groups.insert(g);
  }
  EXPECT_EQ(groups.size(), kBlockFormats.size());
}

TEST(BlockFormat, PresetsMadeFromTheRowsEqualTheLlmCompressorDefinitions) {
  // compressed-tensors NVFP4 / NVFP4A16 / MXFP4 / MXFP4A16 presets, spelled out.
  const json nvfp4_w = {{"num_bits", 4}, {"type", "float"}, {"strategy", "tensor_group"}, {"group_size", 16},
                        {"symmetric", true}, {"dynamic", false}, {"scale_dtype", "torch.float8_e4m3fn"}};
  json nvfp4_a = nvfp4_w;
  nvfp4_a["dynamic"] = "local";
  const json mxfp4_w = {{"num_bits", 4}, {"type", "float"}, {"strategy", "group"}, {"group_size", 32},
                        {"symmetric", true}, {"dynamic", false}, {"scale_dtype", "torch.uint8"}};
  json mxfp4_a = mxfp4_w;
  mxfp4_a["dynamic"] = true;
  struct Case {
    const char* preset;
    json weights;
    json input;
    const char* format;
  };
  const Case cases[] = {{"NVFP4", nvfp4_w, nvfp4_a, "nvfp4-pack-quantized"},
                        {"NVFP4A16", nvfp4_w, nullptr, "nvfp4-pack-quantized"},
                        {"MXFP4", mxfp4_w, mxfp4_a, "mxfp4-pack-quantized"},
                        {"MXFP4A16", mxfp4_w, nullptr, "mxfp4-pack-quantized"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.preset);
    // No global format: the parser infers it from the args, as the writer does.
    const json preset = {{"quantization_config",
                          {{"quant_method", "compressed-tensors"}, {"config_groups", {{c.preset, {"Linear"}}}}}}};
    const QuantConfig from_preset = parse_quant_config(preset, nullptr);
    ASSERT_EQ(from_preset.groups.size(), 1u);
    EXPECT_EQ(from_preset.groups[0].weights, parse_quant_args(c.weights, "weights"));
    if (c.input.is_null()) {
      EXPECT_FALSE(from_preset.groups[0].input.has_value());
    } else {
      EXPECT_EQ(from_preset.groups[0].input, parse_quant_args(c.input, "input"));
    }
    EXPECT_EQ(from_preset.groups[0].format, c.format);
  }
}

}  // namespace
}  // namespace fp4serve::quant
