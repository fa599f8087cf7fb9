// SPDX-License-Identifier: Apache-2.0
// One or more named tests per rule of docs/SCHEMES.md ("Rules"). Test names start with
// the rule number so that `--gtest_filter=Rule4*` selects a rule.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "fp4serve/error.h"
#include "plan/layer_plan.h"
#include "plan/synthetic.h"  // tests/plan (tests/ is on the include path)

namespace fp4serve::plan {
namespace {

using namespace testing;

LayerPlan plan_llama(const json& qc, const KindOf& kinds, const std::string& dev = "cpu",
                     ActivationQuant mode = ActivationQuant::Auto) {
  return build_plan(model_config("LlamaForCausalLM", {{"quantization_config", qc}}), nullptr, dense_headers(kinds),
                    {catalogue(dev), mode});
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// --- Rule 1: predicates check every distinguishing field -----------------------------------------------------

TEST(Rule1, FloatWeightOnlyConfigIsNeverInt4EvenWithPackQuantizedFormat) {
  // float4 group-128 weight-only: vLLM's type-blind wNa16 predicate would take it as int4.
  const json qc = ct_quant("pack-quantized", ct_args(4, "float", "group", 128), nullptr);
  const std::string msg = error_of([&] { plan_llama(qc, all_but_head(Kind::CtInt4G32)); });
  EXPECT_NE(msg.find("layer model.layers.0.self_attn.q_proj"), std::string::npos) << msg;
  EXPECT_NE(msg.find("match neither NVFP4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("float4 group group_size=128"), std::string::npos) << msg;
}

TEST(Rule1, Int4ConfigIsW4A16Int4) {
  const LayerPlan p = plan_llama(ct_quant("pack-quantized", ct_args(4, "int", "group", 32), nullptr),
                                 all_but_head(Kind::CtInt4G32), "cpu");
  EXPECT_EQ(p.find("model.layers.1.mlp.down_proj")->scheme, SchemeId::W4A16Int4);
}

TEST(Rule1, MxfpArgsNeverTakeNvfp4StorageAndViceVersa) {
  // MXFP4 args (group 32, E8M0) with an nvfp4 format, and NVFP4 args with the mxfp4 format.
  EXPECT_THROW(plan_llama(ct_quant("nvfp4-pack-quantized", mxfp4_w(), nullptr), all_but_head(Kind::CtMxfp4)),
               UnsupportedError);
  EXPECT_THROW(plan_llama(ct_quant("mxfp4-pack-quantized", nvfp4_w(), nullptr), all_but_head(Kind::CtNvfp4A16)),
               UnsupportedError);
  // NVFP4 layout with E8M0 scale dtype, and MXFP4 group size with E4M3 scales: neither format.
  EXPECT_THROW(plan_llama(ct_quant("nvfp4-pack-quantized", ct_args(4, "float", "tensor_group", 16, false, "torch.uint8"), nullptr),
                          all_but_head(Kind::CtNvfp4A16)), UnsupportedError);
  EXPECT_THROW(plan_llama(ct_quant("mxfp4-pack-quantized", ct_args(4, "float", "group", 32, false, "torch.float8_e4m3fn"), nullptr),
                          all_but_head(Kind::CtMxfp4)), UnsupportedError);
  // NVFP4 weights with MXFP4 activations.
  EXPECT_THROW(plan_llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), mxfp4_a()), all_but_head(Kind::CtNvfp4A16)),
               UnsupportedError);
}

TEST(Rule1, Fp4WeightsWithFp8ActivationsAreAnError) {
  const json fp8_token = ct_args(8, "float", "token", nullptr, true);
  for (const std::string dev : {"cpu", "sm90", "sm100", "sm120"}) {
    const std::string msg = error_of([&] {
      plan_llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), fp8_token), all_but_head(Kind::CtNvfp4A16), dev);
    });
    EXPECT_NE(msg.find("NVFP4 weights need NVFP4 activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("input activations: float8 token"), std::string::npos) << msg;
  }
  EXPECT_THROW(plan_llama(ct_quant("mxfp4-pack-quantized", mxfp4_w(), ct_args(8, "int", "token", nullptr, true)),
                          all_but_head(Kind::CtMxfp4)), UnsupportedError);
}

TEST(Rule1, NvfpActivationsMustBeDynamicLocal) {
  EXPECT_THROW(plan_llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), ct_args(4, "float", "tensor_group", 16, true)),
                          all_but_head(Kind::CtNvfp4A4)), UnsupportedError);
}

// --- Rule 2: downgrades drop activation scales and warn with the true reason -----------------------------------

TEST(Rule2, DowngradeDropsInputGlobalScaleAndWarnsOnceWithTheLayerCount) {
  const LayerPlan p = plan_llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), nvfp4_a()), all_but_head(Kind::CtNvfp4A4), "sm90");
  const ModulePlan* q = p.find("model.layers.0.self_attn.q_proj");
  EXPECT_EQ(q->scheme, SchemeId::W4A16Nvfp4);
  EXPECT_TRUE(q->has_input_global_scale);
  ASSERT_NE(q->tensor(TensorRole::InputGlobalScale), nullptr);
  EXPECT_EQ(q->tensor(TensorRole::InputGlobalScale)->name, "model.layers.0.self_attn.q_proj.input_global_scale");
  EXPECT_TRUE(q->tensor(TensorRole::InputGlobalScale)->dropped);
  size_t warnings = 0;
  for (const Notice& n : p.notices) warnings += n.severity == Severity::Warning;
  EXPECT_EQ(warnings, 1u);
  const Notice* w = p.warning(Reason::NoFp4MatrixUnits);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->layers, 14u);
  EXPECT_NE(w->text.find("this device has no FP4 matrix units"), std::string::npos);
}

TEST(Rule2, WeightOnlyCheckpointSaysWeightOnlyByDesignNeverNoFp4Units) {
  const LayerPlan p = plan_llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr), all_but_head(Kind::CtNvfp4A16), "sm90");
  ASSERT_EQ(p.notices.size(), 1u);
  EXPECT_EQ(p.notices[0].severity, Severity::Info);
  EXPECT_NE(p.notices[0].text.find("the checkpoint has no activation scales"), std::string::npos);
  EXPECT_EQ(p.notices[0].text.find("FP4 matrix units"), std::string::npos);
  EXPECT_FALSE(p.find("model.layers.0.mlp.up_proj")->has_input_global_scale);
}

TEST(Rule2, ModelOptDowngradeDropsInputScaleAndRecordsMultiplierConvention) {
  const json hf = {{"quantization", {{"quant_algo", "NVFP4"}, {"group_size", 16}, {"exclude_modules", {"lm_head"}}}}};
  const LayerPlan p = build_plan(model_config("LlamaForCausalLM"), hf, dense_headers(all_but_head(Kind::MoNvfp4A4)),
                                 {catalogue("cpu"), ActivationQuant::Auto});
  const ModulePlan* m = p.find("model.layers.1.mlp.gate_proj");
  EXPECT_EQ(m->global_scale, quant::GlobalScaleConvention::Multiplier);
  EXPECT_EQ(m->tensor(TensorRole::WeightGlobalScale)->name, "model.layers.1.mlp.gate_proj.weight_scale_2");
  EXPECT_TRUE(m->tensor(TensorRole::InputGlobalScale)->dropped);
  const LayerPlan ct = plan_llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), nvfp4_a()), all_but_head(Kind::CtNvfp4A4));
  EXPECT_EQ(ct.find("model.layers.1.mlp.gate_proj")->global_scale, quant::GlobalScaleConvention::Divisor);
}

// --- Rule 3: a weight-only checkpoint is never made W4A4 --------------------------------------------------------

TEST(Rule3, WeightOnlyCheckpointStaysWeightOnlyUnderEveryModeAndDevice) {
  for (const std::string dev : {"sm100", "sm120", "cpu"}) {
    for (ActivationQuant mode : {ActivationQuant::Auto, ActivationQuant::Emulate, ActivationQuant::WeightOnly}) {
      const LayerPlan p = plan_llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr), all_but_head(Kind::CtNvfp4A16), dev, mode);
      EXPECT_EQ(p.find("model.layers.0.self_attn.o_proj")->scheme, SchemeId::W4A16Nvfp4) << dev;
      const LayerPlan mx = plan_llama(ct_quant("mxfp4-pack-quantized", mxfp4_w(), nullptr), all_but_head(Kind::CtMxfp4), dev, mode);
      EXPECT_EQ(mx.find("model.layers.0.self_attn.o_proj")->scheme, SchemeId::W4A16Mxfp4) << dev;
    }
  }
}

// --- Rule 4: fused groups run fused only when the shards agree ------------------------------------------------

TEST(Rule4, AgreeingShardsRunFusedUnderTheGroupName) {
  const LayerPlan p = plan_llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), nvfp4_a()), all_but_head(Kind::CtNvfp4A4));
  for (const char* m : {"q_proj", "k_proj", "v_proj"}) {
    const ModulePlan* mp = p.find(std::string("model.layers.1.self_attn.") + m);
    EXPECT_TRUE(mp->run_fused);
    EXPECT_EQ(mp->run_name, "model.layers.1.self_attn.qkv_proj");
  }
  EXPECT_FALSE(p.find("model.layers.1.self_attn.o_proj")->run_fused);  // no group
}

TEST(Rule4, IgnoredShardSplitsTheGroupAndExplainSaysSo) {
  json qc = ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr, {"lm_head", "model.layers.0.self_attn.q_proj"});
  const LayerPlan p = plan_llama(qc, [](const std::string& m) {
    return (m == "lm_head" || m == "model.layers.0.self_attn.q_proj") ? Kind::Dense : Kind::CtNvfp4A16;
  });
  EXPECT_EQ(p.find("model.layers.0.self_attn.q_proj")->scheme, SchemeId::Unquantized);
  for (const char* m : {"q_proj", "k_proj", "v_proj"}) EXPECT_FALSE(p.find(std::string("model.layers.0.self_attn.") + m)->run_fused);
  EXPECT_EQ(p.find("model.layers.0.self_attn.k_proj")->scheme, SchemeId::W4A16Nvfp4);
  EXPECT_TRUE(p.find("model.layers.1.self_attn.q_proj")->run_fused);  // layer 1 unaffected
  bool said = false;
  for (const Notice& n : p.notices) said |= n.text.find("shards disagree") != std::string::npos &&
                                           n.text.find("qkv_proj") != std::string::npos && n.layers == 3;
  EXPECT_TRUE(said);
}

TEST(Rule4, ShardsWithDifferentFormatsRunUnfusedEachWithItsOwnScheme) {
  json qc = ct_quant("mixed-precision", nvfp4_w(), nullptr);
  qc["config_groups"]["group_0"]["targets"] = {"re:.*gate_proj$"};
  qc["config_groups"]["group_0"]["format"] = "nvfp4-pack-quantized";
  qc["config_groups"]["group_1"] = {{"targets", {"Linear"}}, {"format", "mxfp4-pack-quantized"}, {"weights", mxfp4_w()}};
  const LayerPlan p = plan_llama(qc, [](const std::string& m) {
    if (m == "lm_head") return Kind::Dense;
    return m.ends_with("gate_proj") ? Kind::CtNvfp4A16 : Kind::CtMxfp4;
  });
  const ModulePlan* gate = p.find("model.layers.0.mlp.gate_proj");
  const ModulePlan* up = p.find("model.layers.0.mlp.up_proj");
  EXPECT_EQ(gate->scheme, SchemeId::W4A16Nvfp4);
  EXPECT_EQ(up->scheme, SchemeId::W4A16Mxfp4);
  EXPECT_FALSE(gate->run_fused);
  EXPECT_FALSE(up->run_fused);
  EXPECT_TRUE(p.find("model.layers.0.self_attn.q_proj")->run_fused);
}

TEST(Rule4, FusedShardsKeepTheirOwnGlobalScales) {
  const LayerPlan p = plan_llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), nvfp4_a()), all_but_head(Kind::CtNvfp4A4));
  for (const char* m : {"q_proj", "k_proj", "v_proj"}) {
    const std::string name = std::string("model.layers.0.self_attn.") + m;
    EXPECT_EQ(p.find(name)->tensor(TensorRole::WeightGlobalScale)->name, name + ".weight_global_scale");
  }
}

// --- Rule 5: matching as the producers match ----------------------------------------------------------------

TEST(Rule5, IgnoreRegexWithoutDollarAlsoMatchesGateProj) {
  // re.match(".*mlp.gate", "model.layers.0.mlp.gate_proj") matches: anchored at the start only.
  const json loose = ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr, {"lm_head", "re:.*mlp.gate"});
  const LayerPlan p = plan_llama(loose, [](const std::string& m) {
    return (m == "lm_head" || m.ends_with("mlp.gate_proj")) ? Kind::Dense : Kind::CtNvfp4A16;
  });
  EXPECT_EQ(p.find("model.layers.0.mlp.gate_proj")->quant.origin, quant::MatchOrigin::Ignored);
  EXPECT_EQ(p.find("model.layers.0.mlp.up_proj")->scheme, SchemeId::W4A16Nvfp4);
  EXPECT_FALSE(p.find("model.layers.0.mlp.up_proj")->run_fused);  // gate ignored, up quantized: unfused
}

TEST(Rule5, IgnoreRegexWithDollarMatchesOnlyTheRouter) {
  const json strict = ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr, {"lm_head", "re:.*mlp.gate$"});
  const LayerPlan dense = plan_llama(strict, all_but_head(Kind::CtNvfp4A16));
  EXPECT_EQ(dense.find("model.layers.0.mlp.gate_proj")->scheme, SchemeId::W4A16Nvfp4);
  const LayerPlan moe = build_plan(moe_config({{"quantization_config", strict}}), nullptr,
                                   moe_headers([](const std::string& m) {
                                     return (m == "lm_head" || m.ends_with("mlp.gate")) ? Kind::Dense : Kind::CtNvfp4A16;
                                   }),
                                   {catalogue("cpu"), ActivationQuant::Auto});
  EXPECT_EQ(moe.find("model.layers.1.mlp.gate")->quant.origin, quant::MatchOrigin::Ignored);
  EXPECT_EQ(moe.find("model.layers.1.mlp.experts.3.gate_proj")->scheme, SchemeId::W4A16Nvfp4);
  EXPECT_TRUE(moe.find("model.layers.1.mlp.experts.3.gate_proj")->run_fused);
  EXPECT_EQ(moe.find("model.layers.1.mlp.experts.3.up_proj")->run_name, "model.layers.1.mlp.experts.3.gate_up_proj");
}

TEST(Rule5, IgnoreBeatsTargetsAndExactBeatsRegexBeatsClass) {
  json qc = ct_quant("mixed-precision", nvfp4_w(), nullptr, {"lm_head", "model.layers.0.self_attn.o_proj"});
  qc["config_groups"]["group_0"]["targets"] = {"Linear"};
  qc["config_groups"]["group_0"]["format"] = "nvfp4-pack-quantized";
  qc["config_groups"]["group_1"] = {{"targets", {"re:.*down_proj$", "model.layers.0.self_attn.o_proj"}},
                                    {"format", "mxfp4-pack-quantized"}, {"weights", mxfp4_w()}};
  qc["config_groups"]["group_2"] = {{"targets", {"model.layers.1.mlp.down_proj"}}, {"format", "pack-quantized"},
                                    {"weights", ct_args(4, "int", "group", 32)}};
  const LayerPlan p = plan_llama(qc, [](const std::string& m) {
    if (m == "lm_head" || m == "model.layers.0.self_attn.o_proj") return Kind::Dense;
    if (m == "model.layers.1.mlp.down_proj") return Kind::CtInt4G32;
    return m.ends_with("down_proj") ? Kind::CtMxfp4 : Kind::CtNvfp4A16;
  });
  EXPECT_EQ(p.find("model.layers.0.self_attn.o_proj")->quant.origin, quant::MatchOrigin::Ignored);
  EXPECT_EQ(p.find("model.layers.0.mlp.down_proj")->scheme, SchemeId::W4A16Mxfp4);   // regex beats class
  EXPECT_EQ(p.find("model.layers.1.mlp.down_proj")->scheme, SchemeId::W4A16Int4);    // exact beats regex
  EXPECT_EQ(p.find("model.layers.1.mlp.down_proj")->quant.match_kind, quant::MatchKind::Exact);
  EXPECT_EQ(p.find("model.layers.1.self_attn.o_proj")->scheme, SchemeId::W4A16Nvfp4); // class "Linear"
}

TEST(Rule5, ModelOptMixedPrecisionUnlistedLayerIsUnquantized) {
  json layers = json::object();
  for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    for (int l = 0; l < 2; ++l) layers[fmt::format("model.layers.{}.self_attn.{}", l, m)] = {{"quant_algo", "NVFP4"}, {"group_size", 16}};
  }
  layers["model.layers.0.mlp.gate_proj"] = {{"quant_algo", "FP8"}};
  layers["model.layers.0.mlp.up_proj"] = {{"quant_algo", "FP8"}};
  const json hf = {{"quantization", {{"quant_algo", "MIXED_PRECISION"}, {"quantized_layers", layers}}}};
  const LayerPlan p = build_plan(model_config("LlamaForCausalLM"), hf, dense_headers([&](const std::string& m) {
                                   if (!layers.contains(m)) return Kind::Dense;
                                   return layers[m]["quant_algo"] == "FP8" ? Kind::MoFp8 : Kind::MoNvfp4A4;
                                 }),
                                 {catalogue("cpu"), ActivationQuant::Auto});
  const ModulePlan* down = p.find("model.layers.0.mlp.down_proj");  // siblings are FP8; it is not listed
  EXPECT_EQ(down->scheme, SchemeId::Unquantized);
  EXPECT_EQ(down->quant.origin, quant::MatchOrigin::NotListed);
  EXPECT_EQ(p.find("model.layers.0.mlp.gate_proj")->variant, Variant::Fp8W8A8);
  EXPECT_EQ(p.find("model.layers.0.mlp.gate_proj")->scheme, SchemeId::W8A16Fp8);  // no FP8 matrix units
  EXPECT_EQ(p.find("model.layers.1.self_attn.v_proj")->scheme, SchemeId::W4A16Nvfp4);
}

TEST(Rule5, ModelOptExcludeModulesAreFnmatchPatterns) {
  const json hf = {{"quantization", {{"quant_algo", "W4A16_NVFP4"}, {"exclude_modules", {"lm_head", "model.layers.1.*"}}}}};
  const LayerPlan p = build_plan(model_config("LlamaForCausalLM"), hf, dense_headers([](const std::string& m) {
                                   return (m == "lm_head" || m.starts_with("model.layers.1.")) ? Kind::Dense : Kind::MoNvfp4A16;
                                 }),
                                 {catalogue("cpu"), ActivationQuant::Auto});
  EXPECT_EQ(p.find("model.layers.1.mlp.up_proj")->quant.origin, quant::MatchOrigin::Excluded);
  EXPECT_EQ(p.find("model.layers.0.mlp.up_proj")->scheme, SchemeId::W4A16Nvfp4);
}

// --- Rule 6: parameter contracts checked against the headers ---------------------------------------------------

TEST(Rule6, MissingMisTypedMisShapedAndUnconsumedAreReportedTogether) {
  TensorHeaders h = dense_headers(all_but_head(Kind::CtNvfp4A4));
  h.erase("model.layers.0.self_attn.q_proj.weight_scale");
  h["model.layers.1.mlp.up_proj.weight_packed"].shape = {96, 31};
  h["model.layers.1.mlp.down_proj.weight_global_scale"].dtype = core::DType::BF16;
  put(h, "model.layers.0.mlp.extra_buffer", core::DType::F32, {3});
  const std::string msg = error_of([&] {
    build_plan(model_config("LlamaForCausalLM", {{"quantization_config", ct_quant("nvfp4-pack-quantized", nvfp4_w(), nvfp4_a())}}),
               nullptr, h, {catalogue("cpu"), ActivationQuant::Auto});
  });
  EXPECT_NE(msg.find("4 problems"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing model.layers.0.self_attn.q_proj.weight_scale"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mis-shaped model.layers.1.mlp.up_proj.weight_packed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected [N, K/2] = [96, 32], found [96, 31]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mis-typed model.layers.1.mlp.down_proj.weight_global_scale"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unconsumed model.layers.0.mlp.extra_buffer"), std::string::npos) << msg;
}

TEST(Rule6, StaleGroupSizeContradictingTheScalesIsAnError) {
  // int4 config says group_size 128, the scales are [N, K/32].
  const std::string msg = error_of([&] {
    plan_llama(ct_quant("pack-quantized", ct_args(4, "int", "group", 128), nullptr), all_but_head(Kind::CtInt4G32));
  });
  EXPECT_NE(msg.find("group_size 128 is stale: the tensor implies group_size 32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not divisible by the int4 group size 128"), std::string::npos) << msg;
  // ModelOpt NVFP4 with a stale group_size 128: NVFP4 is group 16 by definition.
  const json hf = {{"quantization", {{"quant_algo", "NVFP4"}, {"group_size", 128}, {"exclude_modules", {"lm_head"}}}}};
  const std::string mo = error_of([&] {
    build_plan(model_config("LlamaForCausalLM"), hf, dense_headers(all_but_head(Kind::MoNvfp4A4)), {catalogue("cpu"), ActivationQuant::Auto});
  });
  EXPECT_NE(mo.find("group_size=128"), std::string::npos) << mo;
}

TEST(Rule6, NonLinearTensorsAreDeclaredSoNothingIsSilentlyIgnored) {
  TensorHeaders h = dense_headers(all_but_head(Kind::Dense));
  h.erase("model.layers.1.post_attention_layernorm.weight");
  const std::string msg = error_of([&] { build_plan(model_config("LlamaForCausalLM"), nullptr, h, {catalogue("cpu"), ActivationQuant::Auto}); });
  EXPECT_NE(msg.find("missing model.layers.1.post_attention_layernorm.weight"), std::string::npos) << msg;
  // An old export's rotary buffer is optional and dropped.
  TensorHeaders h2 = dense_headers(all_but_head(Kind::Dense));
  put(h2, "model.layers.0.self_attn.rotary_emb.inv_freq", core::DType::F32, {kHd / 2});
  const LayerPlan p = build_plan(model_config("LlamaForCausalLM"), nullptr, h2, {catalogue("cpu"), ActivationQuant::Auto});
  bool dropped = false;
  for (const TensorUse& t : p.others) dropped |= t.name.ends_with("inv_freq") && t.dropped;
  EXPECT_TRUE(dropped);
}

// --- Rule 7: expert layout comes from the architecture ---------------------------------------------------------

TEST(Rule7, GatedExpertsPutTwoProjectionsInW13AndLayoutComesFromTheArchitecture) {
  const auto mixtral = checkpoint::describe_model(model_config("MixtralForCausalLM", {{"num_local_experts", kE}}));
  EXPECT_EQ(mixtral.spec->experts, checkpoint::ExpertLayout::PerExpert);
  size_t in_w13 = 0;
  for (const auto& m : mixtral.modules) in_w13 += m.fusion_group == "model.layers.0.block_sparse_moe.experts.2.w13";
  EXPECT_EQ(in_w13, 2u);  // w1 and w3
  const auto granite = checkpoint::describe_model(model_config("GraniteMoeForCausalLM", {{"num_local_experts", kE}}));
  EXPECT_EQ(granite.spec->experts, checkpoint::ExpertLayout::Fused3d);
  EXPECT_EQ(granite.spec->gate_up, checkpoint::GateUpLayout::ConcatenatedHalves);
  for (const auto& m : granite.modules) {
    if (m.role == checkpoint::ModuleRole::ExpertsGateUp) {
      EXPECT_EQ(m.out_features, 2 * kI);
    }
  }
  EXPECT_EQ(checkpoint::architecture_spec("GptOssForCausalLM").gate_up, checkpoint::GateUpLayout::InterleavedRows);
}

// --- Rule 8: global scales must be finite and non-zero where they are divisors --------------------------------
// (check_scale_values reads data; see fixtures_test.cpp Rule8ZeroGlobalScaleInFixtureIsNamed.)

// --- Rule 9: --activation-quant overrides the activation side ---------------------------------------------------

TEST(Rule9, WeightOnlyOverridesANativeW4A4Device) {
  const LayerPlan p = plan_llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), nvfp4_a()), all_but_head(Kind::CtNvfp4A4),
                                 "sm100", ActivationQuant::WeightOnly);
  const ModulePlan* m = p.find("model.layers.0.mlp.down_proj");
  EXPECT_EQ(m->scheme, SchemeId::W4A16Nvfp4);
  EXPECT_EQ(m->reason, Reason::UserWeightOnly);
  EXPECT_TRUE(m->tensor(TensorRole::InputGlobalScale)->dropped);
}

TEST(Rule9, EmulateRunsTheReferenceOnTheCpuAndKeepsTheInputScale) {
  const LayerPlan p = plan_llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), nvfp4_a()), all_but_head(Kind::CtNvfp4A4),
                                 "cpu", ActivationQuant::Emulate);
  const ModulePlan* m = p.find("model.layers.0.mlp.down_proj");
  EXPECT_EQ(m->scheme, SchemeId::W4A4Nvfp4Emulated);
  EXPECT_EQ(m->reason, Reason::Emulated);
  EXPECT_FALSE(m->tensor(TensorRole::InputGlobalScale)->dropped);
  // On a GPU the NVFP4 emulation (bf16 weights as the producer decompresses them) has no kernel: refused, never
  // substituted by another scheme, and the plan says why.
  for (const std::string dev : {"sm90", "sm100"}) {
    const LayerPlan g = plan_llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), nvfp4_a()), all_but_head(Kind::CtNvfp4A4),
                                   dev, ActivationQuant::Emulate);
    const ModulePlan* gm = g.find("model.layers.0.mlp.down_proj");
    EXPECT_FALSE(gm->scheme.has_value()) << dev;
    EXPECT_EQ(gm->reason, Reason::NoKernel) << dev;
    EXPECT_NE(gm->reason_text.find("no NVFP4 W4A4 emulation"), std::string::npos) << gm->reason_text;
  }
}

TEST(Rule9, EmulateRunsTheMxfp4ReferenceAnywhere) {
  for (const std::string dev : {"cpu", "sm90", "sm100", "sm120"}) {
    const LayerPlan p = plan_llama(ct_quant("mxfp4-pack-quantized", mxfp4_w(), mxfp4_a()), all_but_head(Kind::CtMxfp4),
                                   dev, ActivationQuant::Emulate);
    const ModulePlan* m = p.find("model.layers.0.mlp.down_proj");
    EXPECT_EQ(m->scheme, SchemeId::W4A4Mxfp4Emulated) << dev;
    EXPECT_EQ(m->reason, Reason::Emulated) << dev;
    EXPECT_EQ(scheme_name(*m->scheme), "W4A4_MXFP4_EMULATED");
  }
}

TEST(Rule9, EmulateOnALayerWithoutEmulationIsRefusedByNameNotSubstituted) {
  const json fp8 = ct_args(8, "float", "tensor", nullptr);
  for (const std::string dev : {"cpu", "sm90"}) {
    const LayerPlan p = plan_llama(ct_quant("float-quantized", fp8, fp8), all_but_head(Kind::CtFp8Static), dev,
                                   ActivationQuant::Emulate);
    const ModulePlan* m = p.find("model.layers.0.mlp.down_proj");
    EXPECT_FALSE(m->scheme.has_value()) << dev;  // before: W8A16_FP8 (CPU) / W8A8_FP8 (sm90), silently
    EXPECT_EQ(m->reason, Reason::EmulateNotAvailable);
    EXPECT_NE(m->reason_text.find("no emulation of FP8 W8A8"), std::string::npos) << m->reason_text;
    EXPECT_FALSE(p.complete());
  }
}

TEST(Rule9, AutoFollowsTheTable) {
  EXPECT_EQ(plan_llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), nvfp4_a()), all_but_head(Kind::CtNvfp4A4), "sm120")
                .find("model.layers.0.mlp.down_proj")->scheme, SchemeId::W4A4Nvfp4);
}

}  // namespace
}  // namespace fp4serve::plan
