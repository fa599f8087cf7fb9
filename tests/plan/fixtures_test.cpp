// SPDX-License-Identifier: Apache-2.0
// Plans of the checked-in fixtures (tools/gen_config_fixtures.py writes them from FORMATS.md with numpy and the
// safetensors package), read through the real checkpoint reader.
#include <gtest/gtest.h>

#include <optional>

#include "checkpoint/checkpoint.h"
#include "fp4serve/error.h"
#include "plan/layer_plan.h"
#include "plan/synthetic.h"  // catalogue()

namespace fp4serve::plan {
namespace {

using testing::catalogue;

const std::string kConfigs = std::string(FP4SERVE_TEST_DATA) + "/configs/";

struct FixtureCase {
  const char* dir;
  const char* module;
  std::optional<SchemeId> cpu;  // nullopt: the device's catalogue has no kernel for the layer
  std::optional<SchemeId> sm90;
  std::optional<SchemeId> sm100;
  bool complete_on_gpu = true;  // false: another layer (int4, FP8) has no CUDA kernel, so sm90 / sm100 plans are incomplete
};

class Fixtures : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(Fixtures, PlansOnCpuSm90Sm100WithTheExpectedScheme) {
  const FixtureCase c = GetParam();
  const auto ckpt = checkpoint::Checkpoint::open(kConfigs + c.dir);
  for (const auto& [dev, expected] : {std::pair{"cpu", c.cpu}, {"sm90", c.sm90}, {"sm100", c.sm100}}) {
    const LayerPlan p = build_plan(ckpt, {catalogue(dev), ActivationQuant::Auto});
    EXPECT_EQ(p.complete(), std::string(dev) == "cpu" || c.complete_on_gpu) << dev;
    const ModulePlan* m = p.find(c.module);
    ASSERT_NE(m, nullptr) << c.module;
    EXPECT_EQ(m->scheme, expected) << c.dir << " " << dev << ": " << m->reason_text;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, Fixtures,
    ::testing::Values(
        FixtureCase{"ct-nvfp4-llama", "model.layers.1.self_attn.k_proj", SchemeId::W4A16Nvfp4, SchemeId::W4A16Nvfp4, SchemeId::W4A4Nvfp4},
        FixtureCase{"ct-nvfp4a16-qwen3", "model.layers.0.mlp.down_proj", SchemeId::W4A16Nvfp4, SchemeId::W4A16Nvfp4, SchemeId::W4A16Nvfp4},
        FixtureCase{"ct-nvfp4-qwen3moe", "model.layers.1.mlp.experts.3.up_proj", SchemeId::W4A16Nvfp4, SchemeId::W4A16Nvfp4, SchemeId::W4A4Nvfp4},
        FixtureCase{"ct-mxfp4-mixtral", "model.layers.0.block_sparse_moe.experts.1.w3", SchemeId::W4A16Mxfp4, SchemeId::W4A16Mxfp4, SchemeId::W4A4Mxfp4},
        FixtureCase{"ct-mxfp4a16-llama", "model.layers.0.mlp.gate_proj", SchemeId::W4A16Mxfp4, SchemeId::W4A16Mxfp4, SchemeId::W4A16Mxfp4},
        FixtureCase{"ct-w4a16-qwen3moe", "model.layers.0.mlp.experts.0.down_proj", SchemeId::W4A16Int4, std::nullopt, std::nullopt, false},
        FixtureCase{"ct-fp8-granitemoe", "model.layers.0.self_attn.o_proj", SchemeId::W8A16Fp8, std::nullopt, std::nullopt, false},
        FixtureCase{"mo-nvfp4-llama", "model.layers.0.mlp.up_proj", SchemeId::W4A16Nvfp4, SchemeId::W4A16Nvfp4, SchemeId::W4A4Nvfp4},
        FixtureCase{"mo-mixed-qwen3", "model.layers.1.mlp.up_proj", SchemeId::Unquantized, SchemeId::Unquantized, SchemeId::Unquantized, false},
        FixtureCase{"gptoss-mxfp4", "model.layers.0.mlp.experts.down_proj", SchemeId::W4A16Mxfp4, SchemeId::W4A16Mxfp4, SchemeId::W4A16Mxfp4}),
    [](const ::testing::TestParamInfo<FixtureCase>& p) {
      std::string name = p.param.dir;
      for (char& ch : name) ch = (ch == '-') ? '_' : ch;
      return name;
    });

TEST(Fixtures, GraniteMoeExpertsAreNotLinearSoTheyStayBf16) {
  const auto ckpt = checkpoint::Checkpoint::open(kConfigs + "ct-fp8-granitemoe");
  const LayerPlan p = build_plan(ckpt, {catalogue("sm90"), ActivationQuant::Auto});
  const ModulePlan* experts = p.find("model.layers.1.block_sparse_moe.input_linear");
  EXPECT_EQ(experts->scheme, SchemeId::Unquantized);
  EXPECT_EQ(experts->quant.origin, quant::MatchOrigin::NotTargeted);
  EXPECT_EQ(experts->module.experts, 4);
  EXPECT_EQ(p.find("model.layers.1.block_sparse_moe.router.layer")->quant.origin, quant::MatchOrigin::Ignored);
}

TEST(Fixtures, ValidScalesPassRule8Check) {
  for (const char* dir : {"ct-nvfp4-llama", "mo-nvfp4-llama", "mo-mixed-qwen3"}) {
    const auto ckpt = checkpoint::Checkpoint::open(kConfigs + dir);
    EXPECT_NO_THROW(check_scale_values(build_plan(ckpt, {catalogue("cpu"), ActivationQuant::Auto}), ckpt)) << dir;
  }
}

TEST(Rule8, ZeroGlobalScaleInFixtureIsNamed) {
  const auto ckpt = checkpoint::Checkpoint::open(kConfigs + "ct-nvfp4-zero-global-scale");
  const LayerPlan p = build_plan(ckpt, {catalogue("cpu"), ActivationQuant::Auto});  // headers are fine
  try {
    check_scale_values(p, ckpt);
    FAIL() << "zero global scale accepted";
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model.layers.1.mlp.up_proj.weight_global_scale = 0"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("gate_proj"), std::string::npos) << msg;  // only the offender is named
  }
}

}  // namespace
}  // namespace fp4serve::plan
