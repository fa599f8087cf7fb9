// SPDX-License-Identifier: Apache-2.0
// The SCHEMES.md decision table, checkpoint variant × device, one case per cell (13 variants written as
// compressed-tensors / ModelOpt Llama checkpoints + GPT-OSS native MXFP4, × 7 devices = 98 cases). The expected
// cells below are copied from SCHEMES.md by hand; the plan is built from synthetic headers (synthetic.h).
#include <gtest/gtest.h>

#include <array>
#include <optional>

#include "plan/layer_plan.h"
#include "plan/synthetic.h"  // tests/plan (tests/ is on the include path)

namespace fp4serve::plan {
namespace {

using namespace testing;

constexpr std::array<const char*, 7> kDevices{"cpu", "sm80", "sm86", "sm89", "sm90", "sm100", "sm120"};

struct Cell {
  std::optional<SchemeId> scheme;  // nullopt: the device's kernel catalogue runs no candidate (explain exits 1)
  Reason reason;
  bool warning;  // a downgrade warning for this layer's (variant, scheme, reason), or the no-kernel warning
};

struct VariantCase {
  const char* name;
  Variant variant;
  std::function<json()> config;
  json hf_quant_config;
  Kind kind;
  std::array<Cell, 7> cells;  // in kDevices order
};

constexpr Cell kNvfp4Down{SchemeId::W4A16Nvfp4, Reason::NoFp4MatrixUnits, true};
constexpr Cell kNvfp4Native{SchemeId::W4A4Nvfp4, Reason::NativeW4A4, false};
constexpr Cell kNvfp4Wo{SchemeId::W4A16Nvfp4, Reason::WeightOnlyByDesign, false};
constexpr Cell kMxfp4Down{SchemeId::W4A16Mxfp4, Reason::NoFp4MatrixUnits, true};
constexpr Cell kMxfp4Native{SchemeId::W4A4Mxfp4, Reason::NativeW4A4, false};
constexpr Cell kMxfp4Sm120{SchemeId::W4A16Mxfp4, Reason::NoMxfp4W4A4, true};
constexpr Cell kMxfp4Wo{SchemeId::W4A16Mxfp4, Reason::WeightOnlyByDesign, false};
constexpr Cell kInt4{SchemeId::W4A16Int4, Reason::WeightOnlyByDesign, false};
constexpr Cell kFp8Down{SchemeId::W8A16Fp8, Reason::NoFp8MatrixUnits, true};
constexpr Cell kFp8Wo{SchemeId::W8A16Fp8, Reason::WeightOnlyByDesign, false};
constexpr Cell kDense{SchemeId::Unquantized, Reason::NotQuantized, false};
// The CUDA catalogue has no int4 or FP8 kernel: those layers have no scheme on a GPU (they run with --device cpu).
constexpr Cell kNoKernel{std::nullopt, Reason::NoKernel, true};

json modelopt(const char* algo) {
  return {{"producer", {{"name", "modelopt"}}},
          {"quantization", {{"quant_algo", algo}, {"kv_cache_quant_algo", nullptr}, {"exclude_modules", {"lm_head"}}}}};
}

std::vector<VariantCase> cases() {
  const auto llama = [](json qc) { return [qc] { return model_config("LlamaForCausalLM", {{"quantization_config", qc}}); }; };
  const auto plain = [] { return model_config("LlamaForCausalLM"); };
  const json fp8_tensor = ct_args(8, "float", "tensor", nullptr);
  const json fp8_channel = ct_args(8, "float", "channel", nullptr);
  const json fp8_token = ct_args(8, "float", "token", nullptr, true);
  const json int4_sym = ct_args(4, "int", "group", 32);
  const json int4_asym = ct_args(4, "int", "group", 32, false, nullptr, false, "group");
  return {
      {"CtNvfp4W4A4", Variant::Nvfp4W4A4, llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), nvfp4_a())), nullptr,
       Kind::CtNvfp4A4, {kNvfp4Down, kNvfp4Down, kNvfp4Down, kNvfp4Down, kNvfp4Down, kNvfp4Native, kNvfp4Native}},
      {"ModelOptNvfp4", Variant::Nvfp4W4A4, plain, modelopt("NVFP4"), Kind::MoNvfp4A4,
       {kNvfp4Down, kNvfp4Down, kNvfp4Down, kNvfp4Down, kNvfp4Down, kNvfp4Native, kNvfp4Native}},
      {"CtNvfp4A16", Variant::Nvfp4W4A16, llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr)), nullptr,
       Kind::CtNvfp4A16, {kNvfp4Wo, kNvfp4Wo, kNvfp4Wo, kNvfp4Wo, kNvfp4Wo, kNvfp4Wo, kNvfp4Wo}},
      {"ModelOptW4A16Nvfp4", Variant::Nvfp4W4A16, plain, modelopt("W4A16_NVFP4"), Kind::MoNvfp4A16,
       {kNvfp4Wo, kNvfp4Wo, kNvfp4Wo, kNvfp4Wo, kNvfp4Wo, kNvfp4Wo, kNvfp4Wo}},
      {"CtMxfp4W4A4", Variant::Mxfp4W4A4, llama(ct_quant("mxfp4-pack-quantized", mxfp4_w(), mxfp4_a())), nullptr,
       Kind::CtMxfp4, {kMxfp4Down, kMxfp4Down, kMxfp4Down, kMxfp4Down, kMxfp4Down, kMxfp4Native, kMxfp4Sm120}},
      {"CtMxfp4A16", Variant::Mxfp4W4A16, llama(ct_quant("mxfp4-pack-quantized", mxfp4_w(), nullptr)), nullptr,
       Kind::CtMxfp4, {kMxfp4Wo, kMxfp4Wo, kMxfp4Wo, kMxfp4Wo, kMxfp4Wo, kMxfp4Wo, kMxfp4Wo}},
      {"CtInt4SymGroup32", Variant::Int4W4A16, llama(ct_quant("pack-quantized", int4_sym, nullptr)), nullptr,
       Kind::CtInt4G32, {kInt4, kNoKernel, kNoKernel, kNoKernel, kNoKernel, kNoKernel, kNoKernel}},
      {"CtInt4AsymActorder", Variant::Int4W4A16, llama(ct_quant("pack-quantized", int4_asym, nullptr)), nullptr,
       Kind::CtInt4AsymActorder, {kInt4, kNoKernel, kNoKernel, kNoKernel, kNoKernel, kNoKernel, kNoKernel}},
      {"CtFp8StaticW8A8", Variant::Fp8W8A8, llama(ct_quant("float-quantized", fp8_tensor, fp8_tensor)), nullptr,
       Kind::CtFp8Static, {kFp8Down, kNoKernel, kNoKernel, kNoKernel, kNoKernel, kNoKernel, kNoKernel}},
      {"CtFp8DynamicW8A8", Variant::Fp8W8A8, llama(ct_quant("float-quantized", fp8_channel, fp8_token)), nullptr,
       Kind::CtFp8Channel, {kFp8Down, kNoKernel, kNoKernel, kNoKernel, kNoKernel, kNoKernel, kNoKernel}},
      {"CtFp8WeightOnly", Variant::Fp8W8A16, llama(ct_quant("naive-quantized", fp8_channel, nullptr)), nullptr,
       Kind::CtFp8Channel, {kFp8Wo, kNoKernel, kNoKernel, kNoKernel, kNoKernel, kNoKernel, kNoKernel}},
      {"ModelOptFp8", Variant::Fp8W8A8, plain, modelopt("FP8"), Kind::MoFp8,
       {kFp8Down, kNoKernel, kNoKernel, kNoKernel, kNoKernel, kNoKernel, kNoKernel}},
      {"Unquantized", Variant::Unquantized, plain, nullptr, Kind::Dense,
       {kDense, kDense, kDense, kDense, kDense, kDense, kDense}},
  };
}

struct Param {
  size_t variant;
  size_t device;
};

class DecisionTable : public ::testing::TestWithParam<Param> {};

TEST_P(DecisionTable, CellMatchesSchemesMd) {
  const VariantCase vc = cases()[GetParam().variant];
  const Cell cell = vc.cells[GetParam().device];
  const LayerPlan plan = build_plan(vc.config(), vc.hf_quant_config, dense_headers(all_but_head(vc.kind)),
                                    {catalogue(kDevices[GetParam().device]), ActivationQuant::Auto});
  EXPECT_EQ(plan.complete(), cell.scheme.has_value());
  size_t quantized = 0;
  for (const ModulePlan& mp : plan.modules) {
    if (mp.module.name == "lm_head" || mp.module.name == "model.embed_tokens") {
      EXPECT_EQ(mp.scheme, SchemeId::Unquantized) << mp.module.name;
      continue;
    }
    ++quantized;
    EXPECT_EQ(mp.variant, vc.variant) << mp.module.name;
    ASSERT_EQ(mp.scheme, cell.scheme) << mp.module.name << ": " << mp.reason_text;
    EXPECT_EQ(mp.reason, cell.reason) << mp.module.name << ": " << mp.reason_text;
    EXPECT_EQ(mp.kernel.ok(), cell.scheme.has_value()) << mp.module.name << ": " << mp.kernel.why_not;
    // The checkpoint's activation scales are consumed; kept only by a scheme that quantizes activations.
    for (const TensorUse& t : mp.tensors) {
      if (cell.scheme && (t.role == TensorRole::InputGlobalScale || t.role == TensorRole::InputScale)) {
        EXPECT_TRUE(mp.has_input_global_scale);
        EXPECT_EQ(t.dropped, !scheme_traits(*cell.scheme).quantizes_activations) << t.name;
      }
    }
  }
  EXPECT_EQ(quantized, 14u);  // 2 layers × 7 Linear
  const Notice* warning = plan.warning(cell.reason);
  EXPECT_EQ(warning != nullptr, cell.warning);
  if (warning != nullptr) {
    EXPECT_EQ(warning->layers, 14u);  // once, with the layer count
  }
  for (const Notice& n : plan.notices) EXPECT_EQ(n.severity == Severity::Warning, cell.warning) << n.text;
}

std::vector<Param> all_params() {
  std::vector<Param> out;
  for (size_t v = 0; v < cases().size(); ++v) {
    for (size_t d = 0; d < kDevices.size(); ++d) out.push_back({v, d});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(VariantByDevice, DecisionTable, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& p) {
                           return std::string(cases()[p.param.variant].name) + "_" + kDevices[p.param.device];
                         });

// GPT-OSS native MXFP4 experts (fused 3-D blocks): MXFP4 weight-only on every device.
class GptOssTable : public ::testing::TestWithParam<size_t> {};

TEST_P(GptOssTable, ExpertsAreW4A16Mxfp4WithoutWarning) {
  const json config = model_config("GptOssForCausalLM",
      {{"num_local_experts", kE}, {"intermediate_size", kH}, {"attention_bias", true},
       {"quantization_config", {{"quant_method", "mxfp4"}, {"modules_to_not_convert",
           {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}}}});
  TensorHeaders h;
  using core::DType;
  put(h, "model.embed_tokens.weight", DType::BF16, {kV, kH});
  put(h, "lm_head.weight", DType::BF16, {kV, kH});
  put(h, "model.norm.weight", DType::BF16, {kH});
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    for (const char* n : {".input_layernorm.weight", ".post_attention_layernorm.weight"}) put(h, p + n, DType::BF16, {kH});
    put(h, p + ".self_attn.sinks", DType::F32, {kHeads});
    for (auto [proj, n, k] : {std::tuple{"q_proj", kHeads * kHd, kH}, {"k_proj", kKv * kHd, kH}, {"v_proj", kKv * kHd, kH},
                              {"o_proj", kH, kHeads * kHd}}) {
      put(h, p + ".self_attn." + proj + ".weight", DType::BF16, {n, k});
      put(h, p + ".self_attn." + proj + ".bias", DType::BF16, {n});
    }
    put(h, p + ".mlp.router.weight", DType::BF16, {kE, kH});
    put(h, p + ".mlp.router.bias", DType::BF16, {kE});
    for (auto [proj, n, k] : {std::tuple{"gate_up_proj", 2 * kH, kH}, {"down_proj", kH, kH}}) {
      const std::string x = p + ".mlp.experts." + proj;
      put(h, x + "_blocks", DType::U8, {kE, n, k / 32, 16});
      put(h, x + "_scales", DType::U8, {kE, n, k / 32});
      put(h, x + "_bias", DType::BF16, {kE, n});
    }
  }
  const LayerPlan plan = build_plan(config, nullptr, h, {catalogue(kDevices[GetParam()]), ActivationQuant::Auto});
  ASSERT_TRUE(plan.complete());
  const ModulePlan* gu = plan.find("model.layers.1.mlp.experts.gate_up_proj");
  ASSERT_NE(gu, nullptr);
  EXPECT_EQ(gu->variant, Variant::Mxfp4W4A16);
  EXPECT_EQ(gu->scheme, SchemeId::W4A16Mxfp4);
  EXPECT_EQ(gu->reason, Reason::WeightOnlyByDesign);
  EXPECT_EQ(gu->module.out_features, 2 * kH);  // gated: gate and up interleaved in one tensor (rule 7)
  EXPECT_EQ(plan.find("model.layers.0.self_attn.q_proj")->scheme, SchemeId::Unquantized);
  EXPECT_EQ(plan.find("model.layers.0.mlp.router")->quant.origin, quant::MatchOrigin::NotTargeted);
  for (const Notice& n : plan.notices) EXPECT_NE(n.severity, Severity::Warning) << n.text;
}

INSTANTIATE_TEST_SUITE_P(Devices, GptOssTable, ::testing::Range<size_t>(0, kDevices.size()),
                         [](const ::testing::TestParamInfo<size_t>& p) { return std::string(kDevices[p.param]); });

}  // namespace
}  // namespace fp4serve::plan
