// SPDX-License-Identifier: Apache-2.0
// `fp4serve explain`: the per-layer scheme and kernel plan of a checkpoint on a device (detected or a dry run),
// from the config files and safetensors headers alone, asked of the same kernel catalogue the loader uses.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "app/commands.h"
#include "app/model_options.h"
#include "app/option_values.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels/attention.h"
#include "backends/cpu/kernels/linear.h"
#include "backends/load_model.h"
#include "backends/registry.h"
#include "checkpoint/checkpoint.h"
#include "fp4serve/error.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "plan/explain.h"
#include "plan/layer_plan.h"
#include "plan/shard.h"

namespace fp4serve::app {
namespace {

struct ExplainOptions {
  std::string model;
  std::string device = "auto";  // parse_plan_device: detection runs when the command does, not while parsing
  plan::ActivationQuant activation_quant = plan::ActivationQuant::Auto;
  std::optional<prepare::ActivationPrecision> activation_precision;  // nullopt: auto
  bool json = false;
  bool verbose = false;
  bool check_scales = false;
  plan::ParallelConfig parallel;  // sizes only: explain shows every rank's split
  double kv_cache_gib = 4.0;      // the KV budget the memory plan divides into blocks (serve's default)
  std::optional<model::KvCacheDtype> kv_cache_dtype;  // nullopt: auto, the checkpoint's dtype on this device
};

// What the CPU backend would run the FP4 linears' activations with, and why (the same choice, and for auto the
// same measurement, as loading on this CPU): one line, or nothing for a GPU (real or dry run).
std::optional<model::ActivationPrecisionChoice> cpu_activation_precision(const ExplainOptions& opts,
                                                                         const plan::DeviceCaps& device,
                                                                         const model::ModelConfig& config) {
  if (device.kind != plan::DeviceKind::Cpu) return std::nullopt;
  return model::choose_activation_precision(opts.activation_precision, device.kind, config.dtype,
                                            model::activation_probe_shape(config),
                                            opts.activation_quant == plan::ActivationQuant::Emulate);
}

// Whether a prefill's attention runs on bf16 dot products under `precision` (the CPU backend's rule and the
// kernel's conditions, as loading would meet them), and if not, why not.
std::string bf16_attention_text(const ExplainOptions& opts, const plan::DeviceCaps& device,
                                const model::ModelConfig& config, prepare::ActivationPrecision precision) {
  if (!backends::cpu::bf16_attention_products(precision)) {
    return fmt::format("no: under {} the linears keep fp32 or int8 activations (bf16 and bf16-decode-int8 take it)",
                       prepare::activation_precision_name(precision));
  }
  const model::KvCacheDtype kv = model::resolve_kv_cache_dtype(opts.kv_cache_dtype, device.kind, config.dtype);
  if (kv != model::KvCacheDtype::Bf16) {
    return fmt::format("no: the KV cache holds {} (its keys and values would be rounded)", model::kv_cache_dtype_name(kv));
  }
  kernels::AttentionParams params{config.num_heads, config.num_kv_heads, config.head_dim, 1.0f};
  params.bf16_dot_products = true;
  if (kernels::prefill_attention_uses_bf16(kernels::KvElement::Bf16, params)) return "yes (bf16 KV cache, AVX512-BF16)";
  if (config.head_dim % 32 != 0) {
    return fmt::format("no: the head dim ({}) is not a multiple of 32, the AVX-512 kernel's panel width", config.head_dim);
  }
  return "no: needs the AVX-512 kernels (GCC build) on a CPU with AVX512-BF16";
}

// The memory plan: the weights as loaded (the plan's resident bytes) and how the KV budget divides into blocks of
// the model's layers and KV heads (model::kv_memory_plan, the numbers serve allocates).
struct MemoryPlanText {
  std::string text;
  nlohmann::json json;
};
MemoryPlanText memory_plan(const ExplainOptions& opts, const model::ModelConfig& config,
                           const plan::LayerPlan& layer_plan) {
  const uint64_t weights = plan::resident_bytes(layer_plan);
  const model::KvCacheDtype element =
      model::resolve_kv_cache_dtype(opts.kv_cache_dtype, layer_plan.device.kind, config.dtype);
  const auto budget = static_cast<int64_t>(opts.kv_cache_gib * static_cast<double>(int64_t{1} << 30));
  const model::KvGroupLayout layout =
      model::kv_group_layout(config.num_layers, model::KvCacheSpec{.layer_windows = config.layer_windows()});
  const model::KvMemoryPlan kv =
      model::kv_memory_plan(layout, config.num_kv_heads, config.head_dim, element, budget);
  MemoryPlanText out;
  out.text = fmt::format(
      "memory plan:\n  weights as loaded {:>10.2f} MiB ({} bytes)\n  KV cache {:>10.2f} GiB budget, {} elements, blocks "
      "of {} positions × {} bytes: {} blocks, {} tokens (all sequences together; --kv-cache-memory, as serve)\n",
      static_cast<double>(weights) / (1 << 20), weights, opts.kv_cache_gib, model::kv_cache_dtype_name(element),
      kv.block_size, kv.bytes_per_block, kv.blocks, kv.tokens);
  if (kv.groups > 1) {
    std::string windows_text;
    for (const int64_t w : layout.group_window) {
      windows_text += fmt::format("{}{}", windows_text.empty() ? "" : ", ", w == 0 ? "all" : std::to_string(w));
    }
    out.text += fmt::format(
        "  KV layer groups {} of {} layers each (positions each attends to: {}): a block holds one group's layers; "
        "tokens counts positions of the full-attention layers, and each long sequence also holds {} blocks of its "
        "sliding-window layers\n",
        kv.groups, kv.layers_per_block, windows_text, kv.sliding_blocks_per_sequence);
  }
  out.json = {{"weights_bytes", weights},        {"kv_budget_bytes", kv.budget_bytes},
              {"kv_cache_dtype", std::string(model::kv_cache_dtype_name(element))},
              {"kv_block_size", kv.block_size},  {"kv_bytes_per_block", kv.bytes_per_block},
              {"kv_blocks", kv.blocks},          {"kv_tokens", kv.tokens},
              {"kv_groups", kv.groups},          {"kv_layers_per_block", kv.layers_per_block},
              {"kv_group_windows", layout.group_window},
              {"kv_sliding_blocks_per_sequence", kv.sliding_blocks_per_sequence}};
  return out;
}

// Exit code 1 when a layer has no scheme (the plan is printed first so the reason is visible).
void run_explain(const ExplainOptions& opts) {
  const plan::DeviceCaps device = parse_plan_device(opts.device);
  // The catalogue the loader would use for this device: explain and loading give one answer.
  const std::unique_ptr<plan::KernelCatalogue> catalogue = backends::catalogue_for(device);
  plan::PlanOptions options;
  options.catalogue = catalogue.get();
  options.activation_quant = opts.activation_quant;
  const auto ckpt = checkpoint::Checkpoint::open(resolve_model_path(opts.model, /*allow_file=*/true));
  const plan::LayerPlan layer_plan = plan::build_plan(ckpt, options);
  if (opts.check_scales) plan::check_scale_values(layer_plan, ckpt);
  std::string tp_text;
  const plan::ParallelConfig& parallel = opts.parallel;
  if (parallel.tensor_parallel_size > 1 || parallel.expert_parallel) {
    // Refuses (exit 2, naming the valid sizes) a size the model cannot split.
    const plan::TensorParallelPlan tp =
        plan::plan_tensor_parallel(layer_plan, parallel.tensor_parallel_size, parallel.expert_parallel);
    tp_text = plan::render_tensor_parallel_text(layer_plan, tp);
  }
  // A plan without a scheme for some layer still prints; its memory plan then has nothing to load. explain also
  // reads configs that the plan accepts but loading would refuse (a GPT-OSS config without layer_types): the plan
  // is printed, and the memory plan says why it is missing (and the activation precision line is left out).
  std::optional<MemoryPlanText> memory;
  std::optional<model::ActivationPrecisionChoice> precision;
  std::optional<model::ActivationPrecisionChoice> int4_precision;  // where the model has int4 (W4A16) layers
  std::string attention_bf16;  // bf16_attention_text, with `precision`
  if (layer_plan.complete()) {
    try {
      const model::ModelConfig config = model::parse_model_config(ckpt.config());
      memory = memory_plan(opts, config, layer_plan);
      precision = cpu_activation_precision(opts, device, config);
      if (precision) attention_bf16 = bf16_attention_text(opts, device, config, precision->precision);
      const bool has_int4 = std::any_of(layer_plan.modules.begin(), layer_plan.modules.end(), [](const plan::ModulePlan& m) {
        return m.scheme == plan::SchemeId::W4A16Int4;
      });
      if (precision && has_int4) {
        int4_precision = model::choose_int4_activation_precision(
            opts.activation_precision, device.kind, precision->precision, opts.activation_quant == plan::ActivationQuant::Emulate);
      }
    } catch (const Error& e) {
      memory = MemoryPlanText{fmt::format("memory plan: not available ({})\n", e.what()),
                              nlohmann::json{{"error", e.what()}}};
    }
  }
  if (opts.json) {
    nlohmann::json j = plan::render_explain_json(layer_plan, opts.model);
    if (!tp_text.empty()) j["tensor_parallel"] = tp_text;
    if (memory) j["memory_plan"] = memory->json;
    if (precision) {
      j["activation_precision"] = {{"precision", prepare::activation_precision_name(precision->precision)},
                                   {"reason", precision->reason},
                                   {"amx", kernels::amx_active()},
                                   {"amx_status", kernels::amx_status().reason},
                                   {"prefill_attention_bf16", attention_bf16}};
    }
    if (int4_precision) {
      j["int4_activation_precision"] = {{"precision", prepare::activation_precision_name(int4_precision->precision)},
                                        {"reason", int4_precision->reason}};
    }
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}", plan::render_explain_text(layer_plan, opts.model, opts.verbose));
    if (memory) fmt::print("\n{}", memory->text);
    if (precision) {
      fmt::print("\nCPU activation precision of the FP4 linears (FP8 linears and the lm_head take bf16 under bf16 and "
                 "bf16-decode-int8, else fp32): {}. Why: {}.\n",
                 prepare::activation_precision_name(precision->precision), precision->reason);
      if (int4_precision) {
        fmt::print("CPU activation precision of the int4 linears: {}. Why: {}.\n",
                   prepare::activation_precision_name(int4_precision->precision), int4_precision->reason);
      }
      // The bf16 GEMMs' matrix unit (kernels/linear.h AmxUse): said whatever the precision, as --version does.
      fmt::print("Bf16 GEMMs above the decode GEMV's rows on AMX tiles: {} (AMX {}).\n",
                 kernels::amx_active() ? "yes" : "no", kernels::amx_status().reason);
      fmt::print("Prefill attention on bf16 dot products (q and the softmax weights rounded to bf16): {}.\n",
                 attention_bf16);
    }
    if (!tp_text.empty()) fmt::print("\n{}", tp_text);
  }
  if (!layer_plan.complete()) throw CLI::RuntimeError(1);
}

}  // namespace

void register_explain(CLI::App& root) {
  auto opts = std::make_shared<ExplainOptions>();
  CLI::App* cmd = root.add_subcommand("explain", "Show which execution scheme each layer gets on a device, and why "
                                                 "(reads config files and headers only; on the CPU, auto's activation-precision "
                                                 "measurement runs once per machine)");
  add_model_path_option(*cmd, opts->model, "checkpoint folder, .safetensors file, or ORG/NAME from the local Hugging Face cache");
  cmd->add_option("--device", opts->device, "auto | cpu | cuda | sm80 | sm86 | sm89 | sm90 | sm100 | sm120 (dry run)")
      ->capture_default_str();
  add_parsed_option(*cmd, "--activation-quant", opts->activation_quant, parse_activation_quant,
                    "auto | weight-only | emulate", "auto");
  add_parsed_option(*cmd, "--activation-precision", opts->activation_precision, parse_activation_precision,
                    "CPU: how FP4 linears take activations (auto measures bf16 against int8 on this CPU, as loading "
                    "does) | fp32 | bf16 | int8 | int8-decode | bf16-decode-int8",
                    "auto");
  cmd->add_flag("--json", opts->json, "print JSON (rows, notices, every module with its tensors) instead of a table");
  cmd->add_flag("-v,--verbose", opts->verbose,
                "also list rejected candidates and mark kernels that have never run on this kind of device");
  cmd->add_flag("--check-scales", opts->check_scales,
                "also read the scalar global/input scales (4 bytes each) and reject zero, NaN or Inf");
  cmd->add_option("--tensor-parallel-size", opts->parallel.tensor_parallel_size,
                  "also show how N ranks split every layer, and the valid sizes (no MPI needed)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--expert-parallel", opts->parallel.expert_parallel, "MoE layers: whole experts per rank instead of split experts");
  cmd->add_option("--kv-cache-memory", opts->kv_cache_gib,
                  "GiB of KV cache the memory plan divides into blocks (serve's --kv-cache-memory)")
      ->capture_default_str()->check(CLI::Range(1.0 / 1024, 1048576.0));
  add_parsed_option(*cmd, "--kv-cache-dtype", opts->kv_cache_dtype, parse_kv_cache_dtype,
                    "the KV element of the memory plan: auto | fp32 | bf16 | fp16", "auto");
  cmd->callback([opts] { run_explain(*opts); });
}

}  // namespace fp4serve::app
