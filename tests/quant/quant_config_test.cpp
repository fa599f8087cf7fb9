// SPDX-License-Identifier: Apache-2.0
// Config parsing and name matching. Expected values come from docs/FORMATS.md §1.2-§1.8, §3, §5 and Python's
// re.match / fnmatch semantics (noted per case).
#include <gtest/gtest.h>

#include <array>

#include "fp4serve/error.h"
#include "quant/name_match.h"
#include "quant/quant_config.h"

namespace fp4serve::quant {
namespace {

using nlohmann::json;

constexpr std::array<std::string_view, 1> kLinear{"Linear"};

TEST(NameMatch, PrefixRegexIsPythonReMatch) {
  // re.match(r".*mlp.gate", "model.layers.0.mlp.gate_proj") → match; with "$" → None.
  EXPECT_TRUE(PrefixRegex(".*mlp.gate", "t").matches("model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(PrefixRegex(".*mlp.gate$", "t").matches("model.layers.0.mlp.gate_proj"));
  EXPECT_TRUE(PrefixRegex(".*mlp.gate$", "t").matches("model.layers.0.mlp.gate"));
  // Anchored at the start: re.match("layers", "model.layers") → None.
  EXPECT_FALSE(PrefixRegex("layers", "t").matches("model.layers.0"));
  EXPECT_TRUE(PrefixRegex(R"(model\.layers\.\d+\.self_attn\.(q|k|v)_proj)", "t").matches("model.layers.12.self_attn.k_proj"));
  EXPECT_THROW(PrefixRegex("(unclosed", "config.json: ignore[0]"), FormatError);
}

TEST(NameMatch, CtTargetsMatchExactNameClassOrRegex) {
  EXPECT_EQ(CtTarget("lm_head", "t").match("lm_head", kLinear), MatchKind::Exact);
  EXPECT_EQ(CtTarget("Linear", "t").match("model.layers.0.mlp.up_proj", kLinear), MatchKind::ClassName);
  EXPECT_EQ(CtTarget("re:.*up_proj$", "t").match("model.layers.0.mlp.up_proj", kLinear), MatchKind::Regex);
  EXPECT_FALSE(CtTarget("Linear", "t").match("model.embed_tokens", std::array<std::string_view, 1>{"Embedding"}));
  // A plain string is never a substring or regex match.
  EXPECT_FALSE(CtTarget("up_proj", "t").match("model.layers.0.mlp.up_proj", kLinear));
}

TEST(NameMatch, FnmatchFollowsPython) {
  EXPECT_TRUE(fnmatch_case("model.layers.*", "model.layers.3.mlp.up_proj"));  // '*' crosses dots
  EXPECT_TRUE(fnmatch_case("*mlp.gate", "model.layers.0.mlp.gate"));
  EXPECT_FALSE(fnmatch_case("*mlp.gate", "model.layers.0.mlp.gate_proj"));    // fnmatch is a full match
  EXPECT_TRUE(fnmatch_case("model.layers.[01].*", "model.layers.1.x"));
  EXPECT_FALSE(fnmatch_case("model.layers.[!01].*", "model.layers.1.x"));
  EXPECT_TRUE(fnmatch_case("lm_hea?", "lm_head"));
}

TEST(QuantArgs, StrategyInferenceAndAliases) {
  EXPECT_EQ(parse_quant_args({{"num_bits", 8}}, "w").strategy, Strategy::Tensor);
  const QuantArgs g = parse_quant_args({{"num_bits", 4}, {"group_size", 128}}, "w");
  EXPECT_EQ(g.strategy, Strategy::Group);
  EXPECT_EQ(g.type, QuantType::Int);  // default type
  const QuantArgs c = parse_quant_args({{"num_bits", 4}, {"group_size", -1}}, "w");
  EXPECT_EQ(c.strategy, Strategy::Channel);
  EXPECT_FALSE(c.group_size.has_value());
  EXPECT_EQ(parse_quant_args({{"actorder", "dynamic"}}, "w").actorder, ActOrder::Group);
  EXPECT_EQ(parse_quant_args({{"actorder", "static"}}, "w").actorder, ActOrder::Weight);
  EXPECT_EQ(parse_quant_args({{"actorder", true}}, "w").actorder, ActOrder::Group);
  EXPECT_EQ(parse_quant_args({{"scale_dtype", "torch.uint8"}}, "w").scale_dtype, ScaleDtype::E8M0);
  EXPECT_EQ(parse_quant_args({{"scale_dtype", "torch.float8_e4m3fn"}}, "w").scale_dtype, ScaleDtype::E4M3);
  const QuantArgs local = parse_quant_args({{"num_bits", 4}, {"type", "float"}, {"strategy", "tensor_group"},
                                            {"group_size", 16}, {"dynamic", "local"}}, "a");
  EXPECT_EQ(local.dynamic, Dynamic::Local);
  const QuantArgs block = parse_quant_args({{"type", "float"}, {"strategy", "block"}, {"block_structure", "128x64"}}, "w");
  EXPECT_EQ(block.block, (std::array<int64_t, 2>{128, 64}));
}

TEST(QuantArgs, MalformedArgsAreFormatErrorsNamingTheField) {
  EXPECT_THROW(parse_quant_args({{"type", "complex"}}, "w"), FormatError);
  EXPECT_THROW(parse_quant_args({{"strategy", "group"}}, "w"), FormatError);              // no group_size
  EXPECT_THROW(parse_quant_args({{"strategy", "block"}}, "w"), FormatError);              // no block_structure
  EXPECT_THROW(parse_quant_args({{"strategy", "group"}, {"group_size", 32}, {"dynamic", "local"}}, "w"), FormatError);
  EXPECT_THROW(parse_quant_args({{"num_bits", "4"}}, "w"), FormatError);
  EXPECT_THROW(parse_quant_args({{"scale_dtype", "torch.float7"}}, "w"), FormatError);
  try {
    parse_quant_args({{"symmetric", "yes"}}, "config.json: quantization_config.config_groups.g.weights");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("config_groups.g.weights.symmetric"), std::string::npos);
  }
}

json ct(json extra) {
  json qc = {{"quant_method", "compressed-tensors"}, {"format", "nvfp4-pack-quantized"}};
  for (auto& [k, v] : extra.items()) qc[k] = v;
  return {{"quantization_config", qc}};
}

TEST(QuantConfig, PresetGroupsExpand) {
  const QuantConfig c = parse_quant_config(ct({{"config_groups", {{"NVFP4", {"Linear"}}}}}), nullptr);
  ASSERT_EQ(c.groups.size(), 1u);
  EXPECT_EQ(c.groups[0].weights->group_size, 16);
  EXPECT_EQ(c.groups[0].input->dynamic, Dynamic::Local);
  EXPECT_EQ(c.groups[0].format, "nvfp4-pack-quantized");
  const QuantConfig w4 = parse_quant_config(ct({{"format", nullptr}, {"config_groups", {{"W4A16", {"Linear"}}}}}), nullptr);
  EXPECT_EQ(w4.groups[0].weights->group_size, 128);
  EXPECT_EQ(w4.groups[0].format, "pack-quantized");  // writer order when no format is given
  EXPECT_THROW(parse_quant_config(ct({{"config_groups", {{"W3A5_MAGIC", {"Linear"}}}}}), nullptr), UnsupportedError);
}

TEST(QuantConfig, PerGroupFormatBeatsGlobal) {
  const json groups = {{"a", {{"targets", {"Linear"}}, {"format", "pack-quantized"},
                              {"weights", {{"num_bits", 4}, {"group_size", 32}}}}},
                       {"b", {{"targets", {"re:.*down_proj$"}}, {"weights", {{"num_bits", 4}, {"type", "float"},
                              {"strategy", "group"}, {"group_size", 32}}}}}};
  const QuantConfig c = parse_quant_config(ct({{"format", "mxfp4-pack-quantized"}, {"config_groups", groups}}), nullptr);
  EXPECT_EQ(c.groups[0].format, "pack-quantized");
  EXPECT_EQ(c.groups[1].format, "mxfp4-pack-quantized");
  const LayerQuant down = resolve_layer_quant(c, {"model.layers.0.mlp.down_proj", kLinear});
  EXPECT_EQ(down.source, "b");  // regex beats class
  EXPECT_EQ(down.format, StorageFormat::Mxfp4Packed);
}

TEST(QuantConfig, SparseFormatsAreRefused) {
  EXPECT_THROW(parse_quant_config(ct({{"sparsity_config", {{"format", "sparse-24-bitmask"}, {"targets", {"Linear"}}}}}), nullptr),
               UnsupportedError);
  EXPECT_THROW(parse_quant_config(ct({{"config_groups", {{"g", {{"targets", {"Linear"}}, {"format", "marlin-24"},
                                                          {"weights", {{"num_bits", 4}}}}}}}}), nullptr),
               UnsupportedError);
  EXPECT_NO_THROW(parse_quant_config(ct({{"sparsity_config", json::object()}}), nullptr));
}

TEST(QuantConfig, KvCacheSchemeAndTransformsAreParsed) {
  const json tc = {{"config_groups", {{"u", {{"type", "random-hadamard"}, {"randomize", true}, {"head_dim", 16},
                   {"apply", {{{"targets", {"Linear"}}, {"location", "output"}, {"ignore", {"lm_head"}}}}}}}}}};
  const QuantConfig c = parse_quant_config(
      ct({{"kv_cache_scheme", {{"num_bits", 8}, {"type", "float"}, {"strategy", "attn_head"}}}, {"transform_config", tc}}), nullptr);
  ASSERT_TRUE(c.kv_cache.has_value());
  EXPECT_EQ(c.kv_cache->strategy, Strategy::AttnHead);
  const LayerQuant q = resolve_layer_quant(c, {"model.layers.0.mlp.up_proj", kLinear});
  ASSERT_EQ(q.transforms.size(), 1u);
  EXPECT_TRUE(q.transforms[0].online);
  EXPECT_TRUE(q.transforms[0].randomize);
  EXPECT_EQ(q.transforms[0].head_dim, 16);
  EXPECT_TRUE(resolve_layer_quant(c, {"lm_head", kLinear}).transforms.empty());
}

TEST(QuantConfig, ModelOptConvertedConfigJsonAndLowercaseAlgo) {
  const json config = {{"quantization_config", {{"quant_method", "modelopt"}, {"quant_algo", "fp8"},
                                                {"ignore", {"lm_head", "*mlp.gate"}}, {"kv_cache_quant_algo", "FP8"}}}};
  const QuantConfig c = parse_quant_config(config, nullptr);
  EXPECT_EQ(c.producer.producer, Producer::ModelOpt);
  EXPECT_TRUE(c.kv_cache.has_value());
  const LayerQuant router = resolve_layer_quant(c, {"model.layers.3.mlp.gate", kLinear});
  EXPECT_EQ(router.origin, MatchOrigin::Excluded);
  const LayerQuant up = resolve_layer_quant(c, {"model.layers.3.mlp.up_proj", kLinear});
  EXPECT_EQ(up.format, StorageFormat::Fp8);
  EXPECT_EQ(up.weights->strategy, Strategy::Tensor);
  EXPECT_EQ(up.input->dynamic, Dynamic::Static);
}

TEST(QuantConfig, GptOssConvertsOnlyExpertsNotListed) {
  const json config = {{"quantization_config", {{"quant_method", "mxfp4"}, {"modules_to_not_convert",
                        {"model.layers.*.self_attn", "model.layers.*.mlp.router", "lm_head"}}}}};
  const QuantConfig c = parse_quant_config(config, nullptr);
  constexpr std::array<std::string_view, 1> experts{"GptOssExperts"};
  EXPECT_EQ(resolve_layer_quant(c, {"model.layers.0.mlp.experts.gate_up_proj", experts}).format,
            StorageFormat::GptOssMxfp4Blocks);
  EXPECT_EQ(resolve_layer_quant(c, {"model.layers.0.self_attn.q_proj", kLinear}).origin, MatchOrigin::NotTargeted);
  const json excluded = {{"quantization_config", {{"quant_method", "mxfp4"}, {"modules_to_not_convert", {"model.layers.1.mlp"}}}}};
  EXPECT_EQ(resolve_layer_quant(parse_quant_config(excluded, nullptr), {"model.layers.1.mlp.experts.down_proj", experts}).origin,
            MatchOrigin::Excluded);  // a listed parent covers its children
}

TEST(QuantConfig, OtherQuantMethodsAreRefusedByName) {
  try {
    parse_quant_config({{"quantization_config", {{"quant_method", "awq"}}}}, nullptr);
    FAIL();
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("'awq'"), std::string::npos);
  }
}

}  // namespace
}  // namespace fp4serve::quant
