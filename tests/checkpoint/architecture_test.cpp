// SPDX-License-Identifier: Apache-2.0
// Module enumeration per architecture; counts and shapes are worked out by hand from the HF model definitions.
#include "checkpoint/architecture.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "fp4serve/error.h"

namespace fp4serve::checkpoint {
namespace {

using nlohmann::json;

json config(const std::string& arch, json extra = json::object()) {
  json c = {{"architectures", {arch}}, {"hidden_size", 64}, {"intermediate_size", 96}, {"num_hidden_layers", 3},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 128}};
  for (auto& [k, v] : extra.items()) c[k] = v;
  return c;
}

const ModuleInfo* find(const ModelLayout& l, const std::string& name) {
  for (const auto& m : l.modules) if (m.name == name) return &m;
  return nullptr;
}

TEST(Architecture, LlamaModulesShapesAndFusionGroups) {
  const ModelLayout l = describe_model(config("LlamaForCausalLM"));
  EXPECT_EQ(l.modules.size(), 3u * 7u + 2u);  // 7 Linear per layer + embedding + lm_head
  EXPECT_EQ(l.dims.head_dim, 16);            // hidden / heads when head_dim is absent
  const ModuleInfo* k = find(l, "model.layers.2.self_attn.k_proj");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->out_features, 32);  // kv_heads × head_dim
  EXPECT_EQ(k->fusion_group, "model.layers.2.self_attn.qkv_proj");
  EXPECT_FALSE(k->has_bias);
  EXPECT_EQ(find(l, "model.layers.0.mlp.down_proj")->in_features, 96);
  EXPECT_EQ(l.others.size(), 3u * 3u + 1u);  // 2 norms + optional inv_freq per layer, final norm
}

TEST(Architecture, Qwen2HasQkvBiasAndQwen3HasQkNorm) {
  const ModelLayout q2 = describe_model(config("Qwen2ForCausalLM"));
  EXPECT_TRUE(find(q2, "model.layers.0.self_attn.v_proj")->has_bias);
  EXPECT_FALSE(find(q2, "model.layers.0.self_attn.o_proj")->has_bias);
  const ModelLayout q3 = describe_model(config("Qwen3ForCausalLM", {{"head_dim", 32}}));
  EXPECT_EQ(find(q3, "model.layers.0.self_attn.q_proj")->out_features, 128);  // explicit head_dim wins
  EXPECT_TRUE(std::any_of(q3.others.begin(), q3.others.end(), [](const OtherTensor& t) {
    return t.name == "model.layers.1.self_attn.k_norm.weight" && t.shape == std::vector<int64_t>{32};
  }));
}

TEST(Architecture, Qwen2MoeSparseStepMlpOnlyLayersAndSharedExpert) {
  const ModelLayout l = describe_model(config("Qwen2MoeForCausalLM", {{"num_experts", 4}, {"moe_intermediate_size", 32},
      {"shared_expert_intermediate_size", 48}, {"decoder_sparse_step", 1}, {"mlp_only_layers", {1}}}));
  EXPECT_TRUE(l.dims.is_moe_layer(0));
  EXPECT_FALSE(l.dims.is_moe_layer(1));
  EXPECT_NE(find(l, "model.layers.1.mlp.gate_proj"), nullptr);     // dense layer
  EXPECT_EQ(find(l, "model.layers.1.mlp.experts.0.gate_proj"), nullptr);
  EXPECT_EQ(find(l, "model.layers.0.mlp.experts.3.down_proj")->in_features, 32);
  EXPECT_EQ(find(l, "model.layers.0.mlp.shared_expert.up_proj")->out_features, 48);
  EXPECT_EQ(find(l, "model.layers.0.mlp.shared_expert_gate")->out_features, 1);
  EXPECT_EQ(find(l, "model.layers.2.mlp.gate")->role, ModuleRole::Router);
  const ModelLayout step = describe_model(config("Qwen3MoeForCausalLM", {{"num_experts", 4}, {"decoder_sparse_step", 2}}));
  EXPECT_FALSE(step.dims.is_moe_layer(0));
  EXPECT_TRUE(step.dims.is_moe_layer(1));
}

TEST(Architecture, MixtralGraniteMoeAndGptOssExperts) {
  const ModelLayout mx = describe_model(config("MixtralForCausalLM", {{"num_local_experts", 8}}));
  EXPECT_EQ(find(mx, "model.layers.0.block_sparse_moe.experts.7.w3")->fusion_group, "model.layers.0.block_sparse_moe.experts.7.w13");
  EXPECT_EQ(find(mx, "model.layers.0.block_sparse_moe.experts.7.w2")->expert, 7);
  const ModelLayout gr = describe_model(config("GraniteMoeForCausalLM", {{"num_local_experts", 4}}));
  const ModuleInfo* in = find(gr, "model.layers.0.block_sparse_moe.input_linear");
  EXPECT_EQ(in->experts, 4);
  EXPECT_EQ(in->dense_weight, "model.layers.0.block_sparse_moe.input_linear.weight");
  EXPECT_EQ(find(gr, "model.layers.0.block_sparse_moe.router.layer")->class_name, "Linear");
  const ModelLayout go = describe_model(config("GptOssForCausalLM", {{"num_local_experts", 4}, {"head_dim", 16}}));
  const ModuleInfo* gu = find(go, "model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(gu->tensor("blocks"), "model.layers.0.mlp.experts.gate_up_proj_blocks");
  EXPECT_TRUE(gu->dense_weight_in_out);
  EXPECT_TRUE(gu->has_bias);
  EXPECT_TRUE(find(go, "model.layers.0.self_attn.q_proj")->has_bias);  // attention_bias defaults to true
  EXPECT_TRUE(find(go, "model.layers.0.mlp.router")->has_bias);
}

TEST(Architecture, TiedEmbeddingsPointLmHeadAtTheEmbedding) {
  const ModelLayout l = describe_model(config("LlamaForCausalLM", {{"tie_word_embeddings", true}}));
  EXPECT_TRUE(find(l, "lm_head")->tied);
  EXPECT_EQ(find(l, "lm_head")->dense_weight, "model.embed_tokens.weight");
}

TEST(Architecture, BadConfigsAreNamedErrors) {
  EXPECT_THROW(describe_model(config("BertModel")), UnsupportedError);
  json c = config("LlamaForCausalLM");
  c.erase("hidden_size");
  EXPECT_THROW(describe_model(c), FormatError);
  EXPECT_THROW(describe_model(config("LlamaForCausalLM", {{"num_hidden_layers", "3"}})), FormatError);
  EXPECT_THROW(describe_model(config("MixtralForCausalLM")), FormatError);  // num_local_experts missing
  EXPECT_THROW(describe_model(json()), FormatError);
  EXPECT_EQ(supported_architectures().size(), 10u);
}

// The names the model looks modules up by are the names describe_model lists (one table for plan and model).
TEST(ArchitectureNames, RoleNamesAreTheNamesDescribeModelLists) {
  for (const ArchitectureSpec& spec : supported_architectures()) {
    SCOPED_TRACE(std::string(spec.name));
    EXPECT_EQ(layer_name(spec, 3), "model.layers.3");
    EXPECT_EQ(attention_module(spec, 3), "model.layers.3.self_attn");
    EXPECT_EQ(module_name(spec, ModuleRole::QProj, 3), "model.layers.3.self_attn.q_proj");
    EXPECT_EQ(module_name(spec, ModuleRole::DownProj, 0), "model.layers.0.mlp.down_proj");
    EXPECT_EQ(module_name(spec, ModuleRole::LmHead, -1), "lm_head");
    EXPECT_EQ(tensor_name(spec, TensorRole::Embedding, -1), "model.embed_tokens.weight");
    EXPECT_EQ(tensor_name(spec, TensorRole::InputNorm, 2), "model.layers.2.input_layernorm.weight");
    EXPECT_EQ(tensor_name(spec, TensorRole::PostAttentionNorm, 2), "model.layers.2.post_attention_layernorm.weight");
    EXPECT_EQ(tensor_name(spec, TensorRole::QNorm, 1), "model.layers.1.self_attn.q_norm.weight");
    EXPECT_EQ(tensor_name(spec, TensorRole::Sinks, 1), "model.layers.1.self_attn.sinks");
    EXPECT_EQ(tensor_name(spec, TensorRole::FinalNorm, -1), "model.norm.weight");
    EXPECT_THROW(module_name(spec, ModuleRole::ExpertGate, 0), UsageError);  // listed by describe_model only
    EXPECT_THROW(module_name(spec, ModuleRole::Router, 0), UsageError);
  }
  // Every dense-role module describe_model lists for a Qwen2-MoE layer (attention, shared expert) has the name
  // module_name gives its role.
  const json config = {{"architectures", {"Qwen2MoeForCausalLM"}}, {"hidden_size", 64}, {"intermediate_size", 96},
                       {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                       {"vocab_size", 128}, {"num_experts", 4}, {"num_experts_per_tok", 2},
                       {"moe_intermediate_size", 32}, {"shared_expert_intermediate_size", 48}};
  const ModelLayout layout = describe_model(config);
  size_t named = 0;
  for (const ModuleInfo& m : layout.modules) {
    if (m.layer < 0 || m.expert >= 0 || m.role == ModuleRole::Router) continue;
    EXPECT_EQ(m.name, module_name(*layout.spec, m.role, m.layer)) << module_role_name(m.role);
    ++named;
  }
  EXPECT_EQ(named, 2u * (4 + 4));  // q, k, v, o + shared gate, up, down, gate (scalar) per layer
}

}  // namespace
}  // namespace fp4serve::checkpoint
