// SPDX-License-Identifier: Apache-2.0
// Plan building at real scale from headers held in memory: a Qwen3-MoE-shaped NVFP4 W4A4 checkpoint
// (48 layers × 128 experts ≈ 19k Linear modules, ≈ 75k tensors, compressed-tensors naming with routers ignored by a
// `re:` entry). Measures config parsing, name matching, selection and contract validation; opening shards is
// the checkpoint reader's cost and is not included.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <memory>

#include "backends/registry.h"
#include "plan/layer_plan.h"

namespace fp4serve::plan {
namespace {

using nlohmann::json;
constexpr int64_t kH = 2048, kLayers = 48, kExperts = 128, kMoeI = 768, kHeads = 32, kKv = 4, kHd = 128, kV = 151936;

void nvfp4(TensorHeaders& h, const std::string& p, int64_t n, int64_t k) {
  h[p + ".weight_packed"] = {core::DType::U8, {n, k / 2}, static_cast<uint64_t>(n * k / 2)};
  h[p + ".weight_scale"] = {core::DType::F8_E4M3, {n, k / 16}, static_cast<uint64_t>(n * k / 16)};
  h[p + ".weight_global_scale"] = {core::DType::F32, {1}, 4};
  h[p + ".input_global_scale"] = {core::DType::F32, {1}, 4};
}

void bf16(TensorHeaders& h, const std::string& name, std::vector<int64_t> shape) {
  uint64_t n = 2;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  h[name] = {core::DType::BF16, std::move(shape), n};
}

void BM_BuildPlanQwen3MoeScale(benchmark::State& state) {
  const json args_w = {{"num_bits", 4}, {"type", "float"}, {"strategy", "tensor_group"}, {"group_size", 16},
                       {"dynamic", false}, {"scale_dtype", "torch.float8_e4m3fn"}};
  json args_a = args_w;
  args_a["dynamic"] = "local";
  const json config = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"hidden_size", kH}, {"intermediate_size", 6144},
                       {"num_hidden_layers", kLayers}, {"num_attention_heads", kHeads}, {"num_key_value_heads", kKv},
                       {"head_dim", kHd}, {"vocab_size", kV}, {"num_experts", kExperts}, {"moe_intermediate_size", kMoeI},
                       {"quantization_config", {{"quant_method", "compressed-tensors"}, {"format", "nvfp4-pack-quantized"},
                        {"ignore", {"lm_head", "re:.*mlp.gate$"}},
                        {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", args_w}, {"input_activations", args_a}}}}}}}};
  TensorHeaders h;
  bf16(h, "model.embed_tokens.weight", {kV, kH});
  bf16(h, "lm_head.weight", {kV, kH});
  bf16(h, "model.norm.weight", {kH});
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = fmt::format("model.layers.{}", l);
    bf16(h, p + ".input_layernorm.weight", {kH});
    bf16(h, p + ".post_attention_layernorm.weight", {kH});
    bf16(h, p + ".self_attn.q_norm.weight", {kHd});
    bf16(h, p + ".self_attn.k_norm.weight", {kHd});
    nvfp4(h, p + ".self_attn.q_proj", kHeads * kHd, kH);
    nvfp4(h, p + ".self_attn.k_proj", kKv * kHd, kH);
    nvfp4(h, p + ".self_attn.v_proj", kKv * kHd, kH);
    nvfp4(h, p + ".self_attn.o_proj", kH, kHeads * kHd);
    bf16(h, p + ".mlp.gate.weight", {kExperts, kH});
    for (int64_t e = 0; e < kExperts; ++e) {
      const std::string x = fmt::format("{}.mlp.experts.{}", p, e);
      nvfp4(h, x + ".gate_proj", kMoeI, kH);
      nvfp4(h, x + ".up_proj", kMoeI, kH);
      nvfp4(h, x + ".down_proj", kH, kMoeI);
    }
  }
  const std::unique_ptr<KernelCatalogue> sm90 = backends::catalogue_for(dry_run_device(90));
  const PlanOptions options{sm90.get(), ActivationQuant::Auto};
  for (auto _ : state) {
    LayerPlan plan = build_plan(config, nullptr, h, options);
    benchmark::DoNotOptimize(plan.modules.data());
  }
  state.counters["tensors"] = static_cast<double>(h.size());
}
BENCHMARK(BM_BuildPlanQwen3MoeScale)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace fp4serve::plan
