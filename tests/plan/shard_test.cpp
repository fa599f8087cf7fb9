// SPDX-License-Identifier: Apache-2.0
// Tensor-parallel shard arithmetic and refusals (plan/shard.h) on headers-only configs with the shapes of real
// models (config.json numbers as published on the Hugging Face hub): gpt-oss-120b (MXFP4 fused experts),
// Qwen3-30B-A3B (compressed-tensors NVFP4 per-expert Linears), granite-3.1-3b-a800m (GraniteMoe fused 3-D bf16).
// The expected splits are written out from the rules in the issue, not computed by the code under test.
#include <gtest/gtest.h>

#include <functional>
#include <numeric>

#include "fp4serve/error.h"
#include "plan/shard.h"
#include "synthetic.h"

namespace fp4serve::plan {
namespace {

using namespace testing;  // NOLINT: the synthetic-checkpoint helpers
using core::DType;

struct Dims {
  int64_t hidden, inter, layers, heads, kv, head_dim, vocab, experts, top_k;
};

// gpt-oss-120b: hidden 2880, 36 layers, 64 heads, 8 KV heads, head_dim 64, 128 experts (top 4) of width 2880.
constexpr Dims kGptOss120b{2880, 2880, 36, 64, 8, 64, 201088, 128, 4};
// Qwen3-30B-A3B: hidden 2048, 48 layers, 32 heads, 4 KV heads, head_dim 128, 128 experts (top 8) of width 768.
constexpr Dims kQwen3Moe30b{2048, 768, 48, 32, 4, 128, 151936, 128, 8};
// granite-3.1-3b-a800m: hidden 1536, 32 layers, 24 heads, 8 KV heads, head_dim 64, 40 experts (top 8) of width 512.
constexpr Dims kGraniteMoe3b{1536, 512, 32, 24, 8, 64, 49155, 40, 8};

void attention(TensorHeaders& h, const std::string& p, const Dims& d, bool bias) {
  const std::vector<std::pair<std::string, std::array<int64_t, 2>>> mods = {
      {".self_attn.q_proj", {d.heads * d.head_dim, d.hidden}}, {".self_attn.k_proj", {d.kv * d.head_dim, d.hidden}},
      {".self_attn.v_proj", {d.kv * d.head_dim, d.hidden}},    {".self_attn.o_proj", {d.hidden, d.heads * d.head_dim}}};
  for (const auto& [m, s] : mods) {
    put(h, p + m + ".weight", DType::BF16, {s[0], s[1]});
    if (bias) put(h, p + m + ".bias", DType::BF16, {s[0]});
  }
  for (const char* n : {".input_layernorm.weight", ".post_attention_layernorm.weight"}) put(h, p + n, DType::BF16, {d.hidden});
}

// The tensors outside the layers: embedding, final norm and (untied) lm_head.
void embedding_norm_and_head(TensorHeaders& h, const Dims& d, bool tied) {
  put(h, "model.embed_tokens.weight", DType::BF16, {d.vocab, d.hidden});
  put(h, "model.norm.weight", DType::BF16, {d.hidden});
  if (!tied) put(h, "lm_head.weight", DType::BF16, {d.vocab, d.hidden});
}

LayerPlan gpt_oss_plan(const Dims& d) {
  TensorHeaders h;
  embedding_norm_and_head(h, d, /*tied=*/false);
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    attention(h, p, d, true);
    put(h, p + ".self_attn.sinks", DType::BF16, {d.heads});
    put(h, p + ".mlp.router.weight", DType::BF16, {d.experts, d.hidden});
    put(h, p + ".mlp.router.bias", DType::BF16, {d.experts});
    const std::string x = p + ".mlp.experts.";
    put(h, x + "gate_up_proj_blocks", DType::U8, {d.experts, 2 * d.inter, d.hidden / 32, 16});
    put(h, x + "gate_up_proj_scales", DType::U8, {d.experts, 2 * d.inter, d.hidden / 32});
    put(h, x + "gate_up_proj_bias", DType::BF16, {d.experts, 2 * d.inter});
    put(h, x + "down_proj_blocks", DType::U8, {d.experts, d.hidden, d.inter / 32, 16});
    put(h, x + "down_proj_scales", DType::U8, {d.experts, d.hidden, d.inter / 32});
    put(h, x + "down_proj_bias", DType::BF16, {d.experts, d.hidden});
  }
  const json config = {{"architectures", {"GptOssForCausalLM"}}, {"hidden_size", d.hidden},
                       {"intermediate_size", d.inter}, {"num_hidden_layers", d.layers},
                       {"num_attention_heads", d.heads}, {"num_key_value_heads", d.kv}, {"head_dim", d.head_dim},
                       {"vocab_size", d.vocab}, {"num_local_experts", d.experts},
                       {"num_experts_per_tok", d.top_k}, {"attention_bias", true}, {"tie_word_embeddings", false},
                       {"quantization_config", {{"quant_method", "mxfp4"},
                                                {"modules_to_not_convert", {"model.layers.*.self_attn",
                                                                            "model.layers.*.mlp.router",
                                                                            "model.embed_tokens", "lm_head"}}}}};
  return build_plan(config, nullptr, h, {catalogue("sm90"), ActivationQuant::Auto});
}

LayerPlan qwen3_moe_plan(const Dims& d) {
  TensorHeaders h;
  embedding_norm_and_head(h, d, /*tied=*/false);
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    for (const char* n : {".input_layernorm.weight", ".post_attention_layernorm.weight"}) put(h, p + n, DType::BF16, {d.hidden});
    for (const char* n : {".self_attn.q_norm.weight", ".self_attn.k_norm.weight"}) put(h, p + n, DType::BF16, {d.head_dim});
    write_module(h, p + ".self_attn.q_proj", d.heads * d.head_dim, d.hidden, Kind::CtNvfp4A16);
    write_module(h, p + ".self_attn.k_proj", d.kv * d.head_dim, d.hidden, Kind::CtNvfp4A16);
    write_module(h, p + ".self_attn.v_proj", d.kv * d.head_dim, d.hidden, Kind::CtNvfp4A16);
    write_module(h, p + ".self_attn.o_proj", d.hidden, d.heads * d.head_dim, Kind::CtNvfp4A16);
    put(h, p + ".mlp.gate.weight", DType::BF16, {d.experts, d.hidden});
    for (int64_t e = 0; e < d.experts; ++e) {
      const std::string x = p + ".mlp.experts." + std::to_string(e);
      write_module(h, x + ".gate_proj", d.inter, d.hidden, Kind::CtNvfp4A16);
      write_module(h, x + ".up_proj", d.inter, d.hidden, Kind::CtNvfp4A16);
      write_module(h, x + ".down_proj", d.hidden, d.inter, Kind::CtNvfp4A16);
    }
  }
  const json config = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"hidden_size", d.hidden},
                       {"intermediate_size", 6144}, {"moe_intermediate_size", d.inter},
                       {"num_hidden_layers", d.layers}, {"num_attention_heads", d.heads},
                       {"num_key_value_heads", d.kv}, {"head_dim", d.head_dim}, {"vocab_size", d.vocab},
                       {"num_experts", d.experts}, {"num_experts_per_tok", d.top_k}, {"decoder_sparse_step", 1},
                       {"mlp_only_layers", json::array()}, {"tie_word_embeddings", false},
                       {"quantization_config", ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr,
                                                        {"lm_head", "re:.*mlp.gate$"})}};
  return build_plan(config, nullptr, h, {catalogue("sm90"), ActivationQuant::Auto});
}

LayerPlan granite_moe_plan(const Dims& d) {
  TensorHeaders h;
  embedding_norm_and_head(h, d, /*tied=*/true);
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    attention(h, p, d, false);
    put(h, p + ".block_sparse_moe.input_linear.weight", DType::BF16, {d.experts, 2 * d.inter, d.hidden});
    put(h, p + ".block_sparse_moe.output_linear.weight", DType::BF16, {d.experts, d.hidden, d.inter});
    put(h, p + ".block_sparse_moe.router.layer.weight", DType::BF16, {d.experts, d.hidden});
  }
  const json config = {{"architectures", {"GraniteMoeForCausalLM"}}, {"hidden_size", d.hidden},
                       {"intermediate_size", d.inter}, {"num_hidden_layers", d.layers},
                       {"num_attention_heads", d.heads}, {"num_key_value_heads", d.kv},
                       {"vocab_size", d.vocab}, {"num_local_experts", d.experts},
                       {"num_experts_per_tok", d.top_k}, {"tie_word_embeddings", true}};
  return build_plan(config, nullptr, h, {catalogue("cpu"), ActivationQuant::Auto});
}

const ModulePlan& module(const LayerPlan& p, const std::string& name) {
  const ModulePlan* m = p.find(name);
  if (m == nullptr) throw std::runtime_error("no module " + name);
  return *m;
}

std::string usage_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// The rule in words: N divides the heads, N divides the KV heads or is a multiple of them, and every rank gets at
// least one whole granule of the (split) expert intermediate, or whole experts otherwise.
std::vector<int> expected_sizes(const Dims& d, int64_t granule, bool expert_parallel) {
  std::vector<int> out;
  for (int n = 1; n <= 64; ++n) {
    const bool heads = d.heads % n == 0 && (d.kv % n == 0 || n % d.kv == 0);
    const bool ffn = expert_parallel ? d.experts >= n : (d.inter / granule >= n || d.experts >= n);
    if (n == 1 || (heads && ffn)) out.push_back(n);
  }
  return out;
}

TEST(ShardArithmetic, SplitsOnGranulesWithTheRemainderOnTheFirstRanks) {
  EXPECT_EQ(split_on_granules(1120, 32, 3), (std::vector<IndexRange>{{0, 384}, {384, 768}, {768, 1120}}));
  EXPECT_EQ(split_on_granules(352, 32, 3), (std::vector<IndexRange>{{0, 128}, {128, 256}, {256, 352}}));
  // 1856 / 8 = 232 would cut an NVFP4 group (232 = 14.5 × 16): the split stays on 16-element boundaries.
  const auto nvfp4 = split_on_granules(1856, 16, 8);
  ASSERT_EQ(nvfp4.size(), 8u);
  for (const IndexRange& r : nvfp4) {
    EXPECT_EQ(r.begin % 16, 0);
    EXPECT_TRUE(r.size() == 240 || r.size() == 224) << r.size();
  }
  EXPECT_EQ(nvfp4.back().end, 1856);
  EXPECT_TRUE(split_on_granules(64, 32, 3).empty());  // a rank without a whole group
  EXPECT_TRUE(split_on_granules(100, 32, 2).empty());  // not a multiple of the group
}

TEST(ShardPlan, GptOss120bSplitsExpertsByTpAtTwoFourEight) {
  const LayerPlan p = gpt_oss_plan(kGptOss120b);
  ASSERT_TRUE(p.complete());
  EXPECT_EQ(valid_tensor_parallel_sizes(p, false), expected_sizes(kGptOss120b, 32, false));
  for (int n : {2, 4, 8}) {
    const TensorParallelPlan tp = plan_tensor_parallel(p, n, false);
    ASSERT_EQ(tp.layers.size(), 36u);
    const LayerShard& l = tp.layers[7];
    EXPECT_EQ(l.ffn, FfnSplit::Intermediate);
    EXPECT_EQ(l.ffn_granule, 32);  // MXFP4 group
    int64_t at = 0;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(l.q_heads[static_cast<size_t>(r)], (IndexRange{r * 64 / n, (r + 1) * 64 / n}));
      EXPECT_EQ(l.kv_heads[static_cast<size_t>(r)], (IndexRange{r * 8 / n, (r + 1) * 8 / n}));
      const ModuleShard down = module_shard(tp, module(p, "model.layers.7.mlp.experts.down_proj"), r);
      EXPECT_EQ(down.columns.begin, at);
      EXPECT_EQ(down.columns.begin % 32, 0);
      EXPECT_EQ(down.bias, r == 0);
      const ModuleShard gate_up = module_shard(tp, module(p, "model.layers.7.mlp.experts.gate_up_proj"), r);
      EXPECT_EQ(gate_up.rows, down.columns);
      at = down.columns.end;
      const ModuleShard o = module_shard(tp, module(p, "model.layers.7.self_attn.o_proj"), r);
      EXPECT_EQ(o.columns, (IndexRange{r * 4096 / n, (r + 1) * 4096 / n}));
      EXPECT_EQ(o.bias, r == 0);
      const ModuleShard q = module_shard(tp, module(p, "model.layers.7.self_attn.q_proj"), r);
      EXPECT_EQ(q.rows, o.columns);
      EXPECT_TRUE(q.bias);  // column-parallel biases are sliced, not dropped
    }
    EXPECT_EQ(at, 2880);
  }
  // 2880 / 32 = 90 groups: TP 8 gives 12 groups to the first two ranks and 11 to the others.
  EXPECT_EQ(plan_tensor_parallel(p, 8, false).layers[0].ffn_columns[1], (IndexRange{384, 768}));
  EXPECT_EQ(plan_tensor_parallel(p, 8, false).layers[0].ffn_columns[7], (IndexRange{2528, 2880}));
  // 64 heads do not split over 3 ranks: the refusal names the valid sizes.
  const std::string why = usage_error_of([&] { plan_tensor_parallel(p, 3, false); });
  EXPECT_NE(why.find("64 attention heads do not split over 3 ranks"), std::string::npos) << why;
  EXPECT_NE(why.find("valid sizes for this model: 1, 2, 4, 8, 16, 32, 64"), std::string::npos) << why;
}

TEST(ShardPlan, GptOss120bExpertParallelGivesWholeExperts) {
  const LayerPlan p = gpt_oss_plan(kGptOss120b);
  const TensorParallelPlan tp = plan_tensor_parallel(p, 8, true);
  const LayerShard& l = tp.layers[0];
  EXPECT_EQ(l.ffn, FfnSplit::WholeExperts);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(l.expert_ranges[static_cast<size_t>(r)], (IndexRange{16 * r, 16 * r + 16}));
  const ModuleShard down = module_shard(tp, module(p, "model.layers.0.mlp.experts.down_proj"), 3);
  EXPECT_EQ(down.columns, (IndexRange{0, 2880}));  // whole experts: no K split, every expert's own bias
  EXPECT_TRUE(down.bias);
}

TEST(ShardPlan, Qwen3Moe30bReplicatesKvHeadsAtEight) {
  const LayerPlan p = qwen3_moe_plan(kQwen3Moe30b);
  ASSERT_TRUE(p.complete());
  EXPECT_EQ(valid_tensor_parallel_sizes(p, false), expected_sizes(kQwen3Moe30b, 16, false));
  for (int n : {2, 4, 8}) {
    const TensorParallelPlan tp = plan_tensor_parallel(p, n, false);
    const LayerShard& l = tp.layers[47];
    EXPECT_EQ(l.ffn_granule, 16);  // NVFP4 group
    EXPECT_EQ(l.ffn_columns.front().size(), 768 / n);
    for (int r = 0; r < n; ++r) {
      // 4 KV heads: split at 2 and 4; at 8 each pair of ranks shares (replicates) the KV head its 4 q heads read.
      const IndexRange kv = n <= 4 ? IndexRange{r * 4 / n, (r + 1) * 4 / n} : IndexRange{r / 2, r / 2 + 1};
      EXPECT_EQ(l.kv_heads[static_cast<size_t>(r)], kv) << n << " " << r;
      const ModuleShard k = module_shard(tp, module(p, "model.layers.47.self_attn.k_proj"), r);
      EXPECT_EQ(k.rows, (IndexRange{kv.begin * 128, kv.end * 128}));
      const ModuleShard up = module_shard(tp, module(p, "model.layers.47.mlp.experts.127.up_proj"), r);
      EXPECT_EQ(up.rows, (IndexRange{r * 768 / n, (r + 1) * 768 / n}));
      const ModuleShard router = module_shard(tp, module(p, "model.layers.47.mlp.gate"), r);
      EXPECT_TRUE(router.whole());
    }
  }
  const TensorParallelPlan ep = plan_tensor_parallel(p, 4, true);
  EXPECT_FALSE(module_shard(ep, module(p, "model.layers.0.mlp.experts.31.down_proj"), 1).present);
  EXPECT_TRUE(module_shard(ep, module(p, "model.layers.0.mlp.experts.32.down_proj"), 1).present);
  EXPECT_TRUE(module_shard(ep, module(p, "model.layers.0.mlp.experts.32.down_proj"), 1).whole());
}

TEST(ShardPlan, GraniteMoe3bRefusesKvHeadsThatNeitherSplitNorReplicate) {
  const LayerPlan p = granite_moe_plan(kGraniteMoe3b);
  ASSERT_TRUE(p.complete());
  EXPECT_EQ(valid_tensor_parallel_sizes(p, false), expected_sizes(kGraniteMoe3b, 8, false));
  for (int n : {2, 4, 8}) {
    const TensorParallelPlan tp = plan_tensor_parallel(p, n, false);
    EXPECT_EQ(tp.layers[31].ffn_columns.front().size(), 512 / n);
    const ModuleShard w13 = module_shard(tp, module(p, "model.layers.31.block_sparse_moe.input_linear"), n - 1);
    EXPECT_EQ(w13.rows, (IndexRange{512 - 512 / n, 512}));
  }
  const std::string why = usage_error_of([&] { plan_tensor_parallel(p, 3, false); });
  EXPECT_NE(why.find("8 KV heads"), std::string::npos) << why;
  EXPECT_NE(why.find("valid sizes for this model: 1, 2, 4, 8"), std::string::npos) << why;
}

TEST(ShardPlan, TooFewGroupsFallsBackToWholeExpertsOrRefusesADenseMlp) {
  // Synthetic MoE (synthetic.h): 4 heads, 2 KV heads, experts of width 32 = 2 NVFP4 groups, 4 experts.
  const LayerPlan moe = build_plan(moe_config({{"quantization_config", ct_quant("nvfp4-pack-quantized", nvfp4_w(), nullptr,
                                                                                {"lm_head", "re:.*mlp.gate$"})}}),
                                   nullptr, moe_headers([](const std::string& m) {
                                     return (m == "lm_head" || m.ends_with("mlp.gate")) ? Kind::Dense : Kind::CtNvfp4A16;
                                   }),
                                   {catalogue("cpu"), ActivationQuant::Auto});
  EXPECT_EQ(plan_tensor_parallel(moe, 2, false).layers[0].ffn, FfnSplit::Intermediate);
  EXPECT_EQ(plan_tensor_parallel(moe, 4, false).layers[0].ffn, FfnSplit::WholeExperts);  // 2 groups < 4 ranks
  // Dense Llama with intermediate 96 in MXFP4 (3 groups): TP 4 leaves a rank without a whole group.
  const LayerPlan dense = build_plan(model_config("LlamaForCausalLM",
                                                  {{"quantization_config", ct_quant("mxfp4-pack-quantized", mxfp4_w(), nullptr)}}),
                                     nullptr, dense_headers(all_but_head(Kind::CtMxfp4)), {catalogue("cpu"), ActivationQuant::Auto});
  EXPECT_EQ(plan_tensor_parallel(dense, 2, false).layers[0].ffn_columns,
            (std::vector<IndexRange>{{0, 64}, {64, 96}}));  // uneven, on the 32-element group
  // At 4 ranks o_proj's K (4 heads × 16) would give each rank 16 columns: half an MXFP4 group.
  const std::string why = usage_error_of([&] { plan_tensor_parallel(dense, 4, false); });
  EXPECT_NE(why.find("o_proj K per rank 16 (1 heads × head_dim 16) is not a multiple of its granule 32"),
            std::string::npos) << why;
  EXPECT_NE(why.find("valid sizes for this model: 1, 2"), std::string::npos) << why;
  EXPECT_NE(usage_error_of([&] { plan_tensor_parallel(dense, 0, false); }).find("expected 1 or more"),
            std::string::npos);
}

TEST(ShardPlan, ExplainTextNamesEverySplit) {
  const LayerPlan p = gpt_oss_plan(kGptOss120b);
  const std::string text = render_tensor_parallel_text(p, plan_tensor_parallel(p, 8, false));
  EXPECT_NE(text.find("tensor_parallel_size 8 (valid sizes for this model: 1, 2, 4, 8, 16, 32, 64)"), std::string::npos) << text;
  EXPECT_NE(text.find("layers 0-35"), std::string::npos) << text;
  EXPECT_NE(text.find("64 q heads, 8 KV heads → 8 q + 1 KV head(s) per rank"), std::string::npos) << text;
  EXPECT_NE(text.find("128 experts, each intermediate 2880 → 384/384/352/352/352/352/352/352 per rank (granule 32)"),
            std::string::npos) << text;
}

}  // namespace
}  // namespace fp4serve::plan
