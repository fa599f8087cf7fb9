// SPDX-License-Identifier: Apache-2.0
// Plan behaviour outside the numbered rules: devices, tied embeddings, refusals, transforms, KV scales, explain.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "fp4serve/error.h"
#include "plan/explain.h"
#include "plan/layer_plan.h"
#include "plan/name_pattern.h"
#include "plan/synthetic.h"  // tests/plan (tests/ is on the include path)

namespace fp4serve::plan {
namespace {

using namespace testing;

LayerPlan plan_for(const json& config, const TensorHeaders& h, const std::string& dev = "cpu",
                   ActivationQuant mode = ActivationQuant::Auto) {
  return build_plan(config, nullptr, h, {catalogue(dev), mode});
}

json llama(const json& qc) { return model_config("LlamaForCausalLM", {{"quantization_config", qc}}); }

TEST(Device, DryRunsAreUndetectedCudaDevicesWithTheirCapability) {
  EXPECT_EQ(dry_run_device(90).sm, 90);
  EXPECT_EQ(dry_run_device(120).kind, DeviceKind::Cuda);
  EXPECT_FALSE(dry_run_device(100).detected);
  EXPECT_EQ(dry_run_device(86).label(), "sm86");
  EXPECT_EQ(resolve_device(DeviceChoice::Cpu).kind, DeviceKind::Cpu);
  EXPECT_TRUE(resolve_device(DeviceChoice::Cpu).detected);
  EXPECT_THROW(dry_run_device(9), UsageError);
  EXPECT_THROW(dry_run_device(200), UsageError);
  EXPECT_TRUE(dry_run_device(89).has_fp8_mma());
  EXPECT_FALSE(dry_run_device(86).has_fp8_mma());
  EXPECT_TRUE(dry_run_device(120).has_nvfp4_mma());
  EXPECT_FALSE(dry_run_device(90).has_nvfp4_mma());
}

TEST(Plan, BelowSm80HasNoSchemeForFp4AndSaysWhy) {
  const LayerPlan p = plan_for(llama(ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr)), dense_headers(all_but_head(Kind::CtNvfp4A16)), "sm75");
  EXPECT_FALSE(p.complete());
  const ModulePlan* m = p.find("model.layers.0.self_attn.q_proj");
  EXPECT_FALSE(m->scheme.has_value());
  EXPECT_EQ(m->reason, Reason::DeviceTooOld);
  EXPECT_NE(m->reason_text.find("below sm80"), std::string::npos);
  ASSERT_EQ(m->rejected.size(), 1u);
  EXPECT_EQ(m->rejected[0].scheme, SchemeId::W4A16Nvfp4);
  // fp4serve's CUDA kernels need sm80: below it nothing runs, not even bf16 layers or attention.
  EXPECT_FALSE(p.find("lm_head")->scheme.has_value());
  EXPECT_FALSE(p.attention.ok());
  EXPECT_NE(p.attention.why_not.find("below sm80"), std::string::npos) << p.attention.why_not;
}

TEST(Plan, Fp8W8A8OnTheCpuIsW8A16WithWarningAndHasNoCudaKernel) {
  const json qc = ct_quant("float-quantized", ct_args(8, "float", "tensor", nullptr), ct_args(8, "float", "tensor", nullptr));
  const LayerPlan a = plan_for(llama(qc), dense_headers(all_but_head(Kind::CtFp8Static)), "cpu");
  const ModulePlan* m = a.find("model.layers.0.mlp.up_proj");
  EXPECT_EQ(m->scheme, SchemeId::W8A16Fp8);
  EXPECT_TRUE(m->tensor(TensorRole::InputScale)->dropped);
  ASSERT_NE(a.warning(Reason::NoFp8MatrixUnits), nullptr);
  ASSERT_EQ(m->rejected.size(), 1u);
  EXPECT_EQ(m->rejected[0].scheme, SchemeId::W8A8Fp8);
  // sm89 has FP8 matrix units, but the CUDA catalogue has no FP8 kernel: both candidates are refused, and
  // explain and the loader say so instead of planning a layer the GPU cannot run.
  const LayerPlan b = plan_for(llama(qc), dense_headers(all_but_head(Kind::CtFp8Static)), "sm89");
  const ModulePlan* g = b.find("model.layers.0.mlp.up_proj");
  EXPECT_FALSE(g->scheme.has_value());
  EXPECT_EQ(g->reason, Reason::NoKernel);
  ASSERT_EQ(g->rejected.size(), 2u);
  EXPECT_NE(g->rejected[0].why.find("no CUDA FP8 kernel"), std::string::npos) << g->rejected[0].why;
  EXPECT_FALSE(b.complete());
  EXPECT_EQ(b.warning(Reason::NoFp8MatrixUnits), nullptr);
}

TEST(Plan, QuantizedLmHeadWithTiedEmbeddingsUsesItsOwnTensors) {
  const json config = model_config("LlamaForCausalLM", {{"tie_word_embeddings", true},
      {"quantization_config", ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr, json::array())}});
  const LayerPlan p = plan_for(config, dense_headers([](const std::string&) { return Kind::CtNvfp4A16; }, false, true));
  const ModulePlan* head = p.find("lm_head");
  EXPECT_EQ(head->scheme, SchemeId::W4A16Nvfp4);
  EXPECT_TRUE(head->module.tied);
  EXPECT_EQ(head->tensor(TensorRole::WeightPacked)->name, "lm_head.weight_packed");
  EXPECT_EQ(p.find("model.embed_tokens")->scheme, SchemeId::Unquantized);  // Embedding is not a Linear
}

TEST(Plan, IgnoredLmHeadWithTiedEmbeddingsSharesTheEmbedding) {
  const json config = model_config("LlamaForCausalLM", {{"tie_word_embeddings", true},
      {"quantization_config", ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr)}});
  const LayerPlan p = plan_for(config, dense_headers(all_but_head(Kind::CtNvfp4A16), false, true));
  const ModulePlan* head = p.find("lm_head");
  EXPECT_EQ(head->scheme, SchemeId::Unquantized);
  ASSERT_EQ(head->tensors.size(), 1u);
  EXPECT_EQ(head->tensors[0].name, "model.embed_tokens.weight");
  EXPECT_TRUE(head->tensors[0].shared);
  EXPECT_NE(head->reason_text.find("tied"), std::string::npos);
  // Counted once in the resident total.
  uint64_t expected = 0;
  for (const ModulePlan& mp : p.modules) {
    for (const TensorUse& t : mp.tensors) expected += (t.dropped || t.shared) ? 0 : t.bytes;
  }
  for (const TensorUse& t : p.others) expected += t.bytes;
  EXPECT_EQ(resident_bytes(p), expected);
}

TEST(Plan, TiedLmHeadQuantizedByConfigButAbsentIsMissing) {
  const json config = model_config("LlamaForCausalLM", {{"tie_word_embeddings", true},
      {"quantization_config", ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr, json::array())}});
  TensorHeaders h = dense_headers(all_but_head(Kind::CtNvfp4A16), false, true);  // no lm_head tensors
  EXPECT_THROW(plan_for(config, h), FormatError);
}

TEST(Plan, UnknownArchitectureListsTheSupportedOnes) {
  try {
    plan_for(model_config("FalconForCausalLM"), {});
    FAIL();
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("GptOssForCausalLM"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("FalconForCausalLM"), std::string::npos);
  }
}

json quip_config(const std::string& online_location) {
  json qc = ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr);
  qc["transform_config"] = {{"config_groups", {{"v", {{"type", "hadamard"}, {"apply", {
      {{"targets", {"re:.*down_proj$"}}, {"location", online_location}},
      {{"targets", {"Linear"}}, {"location", "weight_input"}, {"inverse", true}, {"ignore", {"lm_head"}}}}}}}}}};
  return qc;
}

TEST(Plan, OnlineInputTransformLayersGetASchemeAndTheirMatricesAreAccounted) {
  TensorHeaders h = dense_headers(all_but_head(Kind::CtNvfp4A16));
  for (int l = 0; l < 2; ++l) put(h, fmt::format("model.layers.{}.mlp.down_proj.v_input.weight", l), core::DType::F64, {kI, kI});
  const LayerPlan p = plan_for(llama(quip_config("input")), h);
  const ModulePlan* down = p.find("model.layers.1.mlp.down_proj");
  EXPECT_EQ(down->scheme, SchemeId::W4A16Nvfp4);
  EXPECT_EQ(down->quant.transforms.size(), 2u);
  const TensorUse* m = down->tensor(TensorRole::TransformMatrix);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->name, "model.layers.1.mlp.down_proj.v_input.weight");
  EXPECT_FALSE(m->shared);
  EXPECT_EQ(p.find("model.layers.1.mlp.up_proj")->scheme, SchemeId::W4A16Nvfp4);  // weight_input only: offline
  EXPECT_TRUE(p.complete());
  // explain names the transform per row: K = 96 is not a power of two, so no FWHT; up_proj has none.
  EXPECT_EQ(online_transform_summary(*down), "input v hadamard b96 kronecker-hadamard");
  EXPECT_EQ(online_transform_summary(*p.find("model.layers.1.mlp.up_proj")), "");
  const std::string text = render_explain_text(p, "synthetic");
  EXPECT_NE(text.find("online transform"), std::string::npos) << text;
  EXPECT_NE(text.find("input v hadamard b96 kronecker-hadamard"), std::string::npos) << text;
}

TEST(Plan, TiedTransformMatricesStoredOnceServeEveryModuleOfTheirSize) {
  // compressed-tensors ties same-size matrices of a group; save_pretrained writes the first one only.
  TensorHeaders h = dense_headers(all_but_head(Kind::CtNvfp4A16));
  put(h, "model.layers.0.mlp.down_proj.v_input.weight", core::DType::F64, {kI, kI});
  const LayerPlan p = plan_for(llama(quip_config("input")), h);
  const TensorUse* m = p.find("model.layers.1.mlp.down_proj")->tensor(TensorRole::TransformMatrix);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->name, "model.layers.0.mlp.down_proj.v_input.weight");
  EXPECT_TRUE(m->shared);
  EXPECT_TRUE(p.complete());

  TensorHeaders wrong_size = dense_headers(all_but_head(Kind::CtNvfp4A16));
  put(wrong_size, "model.layers.0.mlp.down_proj.v_input.weight", core::DType::F64, {kI / 2, kI / 2});
  EXPECT_THROW(plan_for(llama(quip_config("input")), wrong_size), FormatError);
}

TEST(Plan, OnlineOutputTransformsRunAndOnlyAttentionModulesTakeQAttn) {
  TensorHeaders h = dense_headers(all_but_head(Kind::CtNvfp4A16));
  for (int l = 0; l < 2; ++l) put(h, fmt::format("model.layers.{}.mlp.down_proj.v_output.weight", l), core::DType::BF16, {kH, kH});
  const LayerPlan p = plan_for(llama(quip_config("output")), h);
  const ModulePlan* down = p.find("model.layers.1.mlp.down_proj");
  EXPECT_EQ(down->scheme, SchemeId::W4A16Nvfp4);
  EXPECT_EQ(online_transform_summary(*down), "output v hadamard b64 fwht");
  EXPECT_TRUE(p.complete());

  // q_attn on a Linear: compressed-tensors hooks queries only on attention modules, so nothing would run it.
  TensorHeaders q = dense_headers(all_but_head(Kind::CtNvfp4A16));
  for (int l = 0; l < 2; ++l) put(q, fmt::format("model.layers.{}.mlp.down_proj.v_q_attn.weight", l), core::DType::BF16, {kH, kH});
  const LayerPlan pq = plan_for(llama(quip_config("q_attn")), q);
  const ModulePlan* dq = pq.find("model.layers.1.mlp.down_proj");
  EXPECT_FALSE(dq->scheme.has_value());
  EXPECT_EQ(dq->reason, Reason::OnlineTransform);
  EXPECT_NE(dq->reason_text.find("`q_attn`"), std::string::npos) << dq->reason_text;
  EXPECT_FALSE(pq.complete());
}

TEST(Plan, TransformHeadDimThatDoesNotDivideTheWidthIsAFormatErrorAlsoWhenFused) {
  // weight_input with head_dim 24 on every Linear: K = 64 (q/k/v, gate/up) is not a multiple, so the offline
  // rotation the checkpoint claims cannot have been applied.
  json qc = quip_config("input");
  qc["transform_config"]["config_groups"]["v"]["head_dim"] = 24;
  try {
    plan_for(llama(qc), dense_headers(all_but_head(Kind::CtNvfp4A16)));
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("transform group v at `weight_input` on model.layers.0.self_attn.q_proj: head_dim 24 "
                                         "does not divide the transformed width 64"), std::string::npos) << e.what();
  }
}

TEST(Plan, OnlineTransformOnTheEmbeddingHasNoSchemeAndSaysWhy) {
  json qc = ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr);
  qc["transform_config"] = {{"config_groups", {{"u", {{"type", "hadamard"}, {"apply", {
      {{"targets", {"Embedding"}}, {"location", "output"}}}}}}}}};
  TensorHeaders h = dense_headers(all_but_head(Kind::CtNvfp4A16));
  put(h, "model.embed_tokens.u_output.weight", core::DType::F32, {kH, kH});  // embedding_dim, as compressed-tensors sizes it
  const LayerPlan p = plan_for(llama(qc), h);
  const ModulePlan* e = p.find("model.embed_tokens");
  EXPECT_FALSE(e->scheme.has_value());
  EXPECT_EQ(e->reason, Reason::OnlineTransform);
  EXPECT_NE(e->reason_text.find("embedding"), std::string::npos) << e->reason_text;
  EXPECT_NE(p.warning(Reason::OnlineTransform), nullptr);
}

// SpinQuant R3: q_attn + k_cache on `re:.*self_attn$` with head_dim blocks (here 8 inside the model's 16).
json r3_config(int64_t head_dim, bool randomize = false) {
  json qc = ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr);
  qc["transform_config"] = {{"config_groups", {{"R3", {{"type", "hadamard"}, {"head_dim", head_dim}, {"randomize", randomize},
      {"apply", {{{"targets", {"re:.*self_attn$"}}, {"location", "q_attn"}},
                 {{"targets", {"re:.*self_attn$"}}, {"location", "k_cache"}}}}}}}}};
  return qc;
}

TEST(Plan, AttentionTransformsAreAttachedConsumedAndExplained) {
  TensorHeaders h = dense_headers(all_but_head(Kind::CtNvfp4A16));
  for (int l = 0; l < 2; ++l) {
    for (const char* loc : {"q_attn", "k_cache"}) {
      put(h, fmt::format("model.layers.{}.self_attn.R3_{}.weight", l, loc), core::DType::F32, {8, 8});
    }
  }
  const LayerPlan p = plan_for(llama(r3_config(8)), h);
  EXPECT_TRUE(p.complete());
  ASSERT_EQ(p.attention_transforms.size(), 4u);
  const AttentionTransform* k1 = p.attention_transform(1, "k_cache");
  ASSERT_NE(k1, nullptr);
  EXPECT_EQ(k1->module, "model.layers.1.self_attn");
  EXPECT_EQ(k1->block, 8);
  ASSERT_NE(k1->tensor(TensorRole::TransformMatrix), nullptr);
  EXPECT_EQ(k1->tensor(TensorRole::TransformMatrix)->name, "model.layers.1.self_attn.R3_k_cache.weight");
  EXPECT_EQ(attention_transform_summary(*k1), "k_cache R3 hadamard b8 fwht");
  const std::string text = render_explain_text(p, "synthetic");
  EXPECT_NE(text.find("model.layers.*.self_attn"), std::string::npos) << text;
  EXPECT_NE(text.find("q_attn R3 hadamard b8 fwht"), std::string::npos) << text;
  EXPECT_NE(text.find("k_cache R3 hadamard b8 fwht"), std::string::npos) << text;
  EXPECT_EQ(p.find("model.layers.0.self_attn.q_proj")->quant.transforms.size(), 0u);

  // A class-name target reaches the attention module too (transformers' LlamaAttention), a Linear class does not.
  json by_class = r3_config(8);
  for (auto& a : by_class["transform_config"]["config_groups"]["R3"]["apply"]) a["targets"] = {"LlamaAttention"};
  EXPECT_EQ(plan_for(llama(by_class), h).attention_transforms.size(), 4u);

  // compressed-tensors ties q_attn and k_cache (one parameter per size) and may store only one of them.
  TensorHeaders once = dense_headers(all_but_head(Kind::CtNvfp4A16));
  put(once, "model.layers.0.self_attn.R3_q_attn.weight", core::DType::F32, {8, 8});
  put(once, "model.layers.0.self_attn.R3_q_attn.perm", core::DType::I64, {8});
  const LayerPlan tied = plan_for(llama(r3_config(8, true)), once);
  ASSERT_EQ(tied.attention_transforms.size(), 4u);
  EXPECT_EQ(tied.attention_transform(1, "k_cache")->tensor(TensorRole::TransformPerm)->name,
            "model.layers.0.self_attn.R3_q_attn.perm");
}

TEST(Plan, AttentionTransformOfTheWrongSizeIsAFormatErrorNamingTheTensor) {
  for (const auto& [head_dim, stored] : std::vector<std::pair<int64_t, int64_t>>{{8, 4}, {16, 16}, {12, 12}}) {
    SCOPED_TRACE(head_dim);
    TensorHeaders h = dense_headers(all_but_head(Kind::CtNvfp4A16));
    for (int l = 0; l < 2; ++l) {
      for (const char* loc : {"q_attn", "k_cache"}) {
        put(h, fmt::format("model.layers.{}.self_attn.R3_{}.weight", l, loc), core::DType::F32, {stored, stored});
      }
    }
    if (head_dim == 16) {  // right size, but an extra k_cache perm nobody declares is unconsumed
      put(h, "model.layers.0.self_attn.R3_k_cache.perm", core::DType::I64, {16});
    }
    try {
      plan_for(llama(r3_config(head_dim)), h);
      FAIL() << "no error";
    } catch (const FormatError& e) {
      const std::string what = e.what();
      if (head_dim == 16) {
        EXPECT_NE(what.find("unconsumed model.layers.0.self_attn.R3_k_cache.perm"), std::string::npos) << what;
      } else {
        EXPECT_NE(what.find("model.layers.0.self_attn.R3_q_attn.weight"), std::string::npos) << what;
        EXPECT_EQ(what.find("unconsumed model.layers.0.self_attn.R3_q_attn.weight"), std::string::npos) << what;
      }
    }
  }
}

TEST(Plan, AttentionTransformMissingOrMisTypedIsReportedLikeAModuleTensor) {
  TensorHeaders none = dense_headers(all_but_head(Kind::CtNvfp4A16));
  try {
    plan_for(llama(r3_config(8)), none);
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("missing model.layers.0.self_attn.R3_q_attn.weight (layer "
                                         "model.layers.0.self_attn, "), std::string::npos) << e.what();
  }
  TensorHeaders typed = dense_headers(all_but_head(Kind::CtNvfp4A16));
  for (int l = 0; l < 2; ++l) {
    for (const char* loc : {"q_attn", "k_cache"}) {
      put(typed, fmt::format("model.layers.{}.self_attn.R3_{}.weight", l, loc), l == 1 ? core::DType::I32 : core::DType::F32,
          {8, 8});
    }
  }
  try {
    plan_for(llama(r3_config(8)), typed);
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("mis-typed model.layers.1.self_attn.R3_k_cache.weight (layer "
                                         "model.layers.1.self_attn): expected"), std::string::npos) << e.what();
  }
}

TEST(Plan, KvCacheScalesAreDeclaredWhereEachProducerWritesThem) {
  json qc = ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr);
  qc["kv_cache_scheme"] = ct_args(8, "float", "tensor", nullptr);
  TensorHeaders h = dense_headers(all_but_head(Kind::CtNvfp4A16));
  EXPECT_THROW(plan_for(llama(qc), h), FormatError);  // missing k_scale / v_scale
  for (int l = 0; l < 2; ++l) {
    put(h, fmt::format("model.layers.{}.self_attn.k_scale", l), core::DType::BF16, {1});
    put(h, fmt::format("model.layers.{}.self_attn.v_scale", l), core::DType::BF16, {1});
  }
  EXPECT_EQ(plan_for(llama(qc), h).others.size(), 5u + 4u);
}

TEST(Plan, ModelOptAlgorithmsOutsideTheSupportedSetAreRefusedByName) {
  for (const char* algo : {"W4A16_AWQ", "W4A8_AWQ", "NVFP4_AWQ", "W4A8_NVFP4_FP8", "W8A8_SQ_PER_CHANNEL"}) {
    const json hf = {{"quantization", {{"quant_algo", algo}}}};
    try {
      build_plan(model_config("LlamaForCausalLM"), hf, dense_headers(all_but_head(Kind::Dense)), {catalogue("cpu"), ActivationQuant::Auto});
      FAIL() << algo;
    } catch (const UnsupportedError& e) {
      EXPECT_NE(std::string(e.what()).find(algo), std::string::npos) << e.what();
    }
  }
}

TEST(Plan, FullyUnquantizedCheckpointIsUnquantizedEverywhere) {
  const LayerPlan p = plan_for(model_config("LlamaForCausalLM"), dense_headers(all_but_head(Kind::Dense)), "sm80");
  EXPECT_TRUE(p.complete());
  for (const ModulePlan& mp : p.modules) EXPECT_EQ(mp.reason_text, "plain checkpoint (no quantization config)");
  EXPECT_TRUE(p.notices.empty());
}

TEST(Explain, RowsGroupIdenticalDecisionsAcrossLayersAndExperts) {
  const json qc = ct_quant("nvfp4-pack-quantized", nvfp4_w(), nvfp4_a(), {"lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"});
  const LayerPlan p = build_plan(moe_config({{"quantization_config", qc}}), nullptr, moe_headers([](const std::string& m) {
                                   return (m == "lm_head" || m.ends_with("mlp.gate")) ? Kind::Dense : Kind::CtNvfp4A4;
                                 }),
                                 {catalogue("sm100"), ActivationQuant::Auto});
  const auto rows = explain_rows(p);
  const auto find = [&](const std::string& pattern) -> const ExplainRow* {
    for (const auto& r : rows) if (r.pattern == pattern) return &r;
    return nullptr;
  };
  ASSERT_NE(find("model.layers.*.mlp.experts.*.gate_up_proj"), nullptr);
  EXPECT_EQ(find("model.layers.*.mlp.experts.*.gate_up_proj")->count, 8u);  // 2 layers × 4 experts, fused
  EXPECT_EQ(find("model.layers.*.mlp.experts.*.gate_up_proj")->scheme, "W4A4_NVFP4");
  ASSERT_NE(find("model.layers.*.mlp.gate"), nullptr);
  EXPECT_EQ(find("model.layers.*.mlp.gate")->count, 2u);  // one row although the ignore entries differ by layer
  EXPECT_EQ(find("model.layers.*.self_attn.qkv_proj")->backend, "cuda-sm100");
  const json j = render_explain_json(p, "x");
  EXPECT_TRUE(j["complete"].get<bool>());
  EXPECT_EQ(j["modules"].size(), p.modules.size());
  EXPECT_EQ(name_pattern("model.layers.12.mlp.experts.3.w1"), "model.layers.*.mlp.experts.*.w1");
}

}  // namespace
}  // namespace fp4serve::plan
