// SPDX-License-Identifier: Apache-2.0
#include "backends/load_model.h"

#include <fmt/format.h>

#include <chrono>

#include "backends/cpu/kernels/linear.h"
#include "backends/registry.h"
#include "core/threading.h"
#include "fp4serve/error.h"
#include "model/backend.h"
#include "model/planned_weights.h"
#include "plan/device_caps.h"
#include "plan/layer_plan.h"
#include "plan/select.h"
#include "plan/shard.h"

namespace fp4serve::model {
namespace {

// The plan refuses nothing by itself; a model runs only when every layer has a scheme.
void require_complete(const plan::LayerPlan& p, const std::filesystem::path& dir) {
  if (p.complete()) return;
  std::string lines;
  size_t missing = 0;
  for (const plan::ModulePlan& m : p.modules) {
    if (m.scheme) continue;
    if (++missing <= 5) lines += fmt::format("\n  {}: {}", m.module.name, m.reason_text);
  }
  if (missing > 5) lines += fmt::format("\n  … and {} more", missing - 5);
  if (!p.attention.ok()) lines += fmt::format("\n  attention: {}", p.attention.why_not);
  throw UnsupportedError(fmt::format("{}: {} layer(s) have no execution scheme on {}{}:{}", dir.string(), missing,
                                     p.device.label(), p.attention.ok() ? "" : " and attention has no kernel", lines));
}

// The options as prepare takes them; activation_precision comes from resolve_activation_precision with the
// checkpoint's dtype (model_dtype "" before the checkpoint is read: a check of the choice alone).
PrepareOptions prepare_options(const LoadOptions& options, const std::string& model_dtype) {
  PrepareOptions out;
  out.activation_precision = resolve_activation_precision(options.activation_precision, options.device, model_dtype);
  if (options.lm_head_dtype == "fp8") {
    out.lm_head_dtype = LmHeadDtype::Fp8;
  } else if (options.lm_head_dtype == "int8") {
    out.lm_head_dtype = LmHeadDtype::Int8;
  } else if (options.lm_head_dtype != "bf16") {
    throw UsageError(fmt::format("--lm-head-dtype: '{}' is not bf16, fp8 or int8", options.lm_head_dtype));
  }
  return out;
}

}  // namespace

prepare::ActivationPrecision resolve_activation_precision(const std::string& choice, const std::string& device,
                                                          const std::string& model_dtype) {
  if (choice == "auto") {
    const bool bf16_dots = device != "cuda" && kernels::bf16_dot_active();
    return bf16_dots && model_dtype == "bfloat16" ? prepare::ActivationPrecision::Bf16
                                                  : prepare::ActivationPrecision::Fp32;
  }
  if (choice == "fp32") return prepare::ActivationPrecision::Fp32;
  if (choice == "bf16") return prepare::ActivationPrecision::Bf16;
  if (choice == "int8") return prepare::ActivationPrecision::Int8;
  if (choice == "int8-decode") return prepare::ActivationPrecision::Int8Decode;
  throw UsageError(fmt::format("--activation-precision: '{}' is not auto, fp32, bf16, int8 or int8-decode", choice));
}

const char* activation_precision_name(prepare::ActivationPrecision precision) {
  switch (precision) {
    case prepare::ActivationPrecision::Fp32: return "fp32";
    case prepare::ActivationPrecision::Bf16: return "bf16";
    case prepare::ActivationPrecision::Int8: return "int8";
    case prepare::ActivationPrecision::Int8Decode: return "int8-decode";
  }
  return "?";
}

KvCacheDtype resolve_kv_cache_dtype(const std::string& choice, const std::string& device,
                                    const std::string& model_dtype) {
  const bool gpu = device == "cuda";
  if (choice == "auto") {
    if (gpu) return KvCacheDtype::F32;
    if (model_dtype == "bfloat16") return KvCacheDtype::Bf16;
    if (model_dtype == "float16") return KvCacheDtype::F16;
    return KvCacheDtype::F32;
  }
  if (choice == "fp32") return KvCacheDtype::F32;
  if (choice != "bf16" && choice != "fp16") {
    throw UsageError(fmt::format("--kv-cache-dtype: '{}' is not auto, fp32, bf16 or fp16", choice));
  }
  if (gpu) {
    throw UsageError(fmt::format("--kv-cache-dtype {}: the GPU backend keeps an fp32 KV cache (use auto or fp32 with "
                                 "--device cuda)", choice));
  }
  return choice == "bf16" ? KvCacheDtype::Bf16 : KvCacheDtype::F16;
}

LoadedModel load_model(const std::filesystem::path& dir, const LoadOptions& requested) {
  const auto t0 = std::chrono::steady_clock::now();
  // "auto" is the GPU when one is found, else the CPU, resolved once here: the plan's catalogue and the backend
  // must be of the same device (a GPU plan loaded onto the CPU backend would refuse what the CPU runs).
  LoadOptions options = requested;
  if (options.device == "auto") {
    options.device = plan::resolve_device("auto").kind == plan::DeviceKind::Cuda ? "cuda" : "cpu";
  }
  // --device cuda runs on the GPU: the backend is made first, so that a build or machine without one is refused
  // before any weight is read. A dry-run name (sm80 …) only plans and is refused below.
  const PrepareOptions checked = prepare_options(options, "");  // a bad choice is refused before anything is read
  if (options.device == "cuda" && (checked.activation_precision != prepare::ActivationPrecision::Fp32 ||
                                   checked.lm_head_dtype != LmHeadDtype::Bf16)) {
    throw UsageError(fmt::format("--device cuda: --activation-precision {} / --lm-head-dtype {} are CPU decode paths; the "
                                 "GPU runs fp32/bf16 (leave both at their defaults, or use --device cpu)",
                                 options.activation_precision, options.lm_head_dtype));
  }
  (void)resolve_kv_cache_dtype(options.kv_cache_dtype, options.device, "");  // refuses a bad choice now
  // The plan asks the kernel catalogue of the device that runs the model, the one `explain` asks: nothing is
  // planned that this backend cannot run, and nothing explain accepts is refused here.
  const plan::DeviceCaps device = plan::resolve_device(options.device);  // the no-GPU message for "cuda" without a GPU
  if (!device.detected) {
    throw UsageError(fmt::format("--device {}: a dry-run device only plans (fp4serve explain --device {}); load on "
                                 "cpu or cuda", options.device, options.device));
  }
  const std::unique_ptr<plan::KernelCatalogue> catalogue = backends::catalogue_for(device);
  plan::PlanOptions plan_options;
  plan_options.catalogue = catalogue.get();
  std::unique_ptr<Backend> backend =
      options.device == "cuda" ? backends::make_cuda_backend(options.cuda_device) : nullptr;
  if (options.threads > 0) core::set_num_threads(options.threads);
  LoadedModel loaded{checkpoint::Checkpoint::open(dir), {}, nullptr, {}, 0.0};
  loaded.config = parse_model_config(loaded.checkpoint.config());
  loaded.kv_element = resolve_kv_cache_dtype(options.kv_cache_dtype, options.device, loaded.config.dtype);
  const PrepareOptions prepare = prepare_options(options, loaded.config.dtype);
  loaded.activation_precision = prepare.activation_precision;
  if (backend == nullptr) backend = backends::make_backend(options.device, options.cuda_device, loaded.kv_element);

  plan_options.activation_quant = plan::parse_activation_quant(options.activation_quant);
  const plan::LayerPlan layer_plan = plan::build_plan(loaded.checkpoint, plan_options);
  require_complete(layer_plan, dir);
  plan::check_scale_values(layer_plan, loaded.checkpoint);
  for (const plan::Notice& notice : layer_plan.notices) {
    if (notice.severity != plan::Severity::Warning) continue;
    loaded.warnings.push_back(fmt::format("{} ({} layers)", notice.text, notice.layers));
  }

  uint64_t tensors = 0, bytes = 0;
  for (const plan::ModulePlan& m : layer_plan.modules) {
    for (const plan::TensorUse& use : m.tensors) {
      if (use.dropped || use.shared) continue;
      ++tensors;
      bytes += use.bytes;
    }
  }
  for (const plan::TensorUse& use : layer_plan.others) {
    if (use.dropped) continue;
    ++tensors;
    bytes += use.bytes;
  }
  const int tp_size = options.tensor_parallel_size;
  const int comm_size = options.comm != nullptr ? options.comm->size() : 1;
  const int comm_rank = options.comm != nullptr ? options.comm->rank() : 0;
  if (tp_size != comm_size || options.rank != comm_rank) {
    throw UsageError(fmt::format("tensor_parallel_size {} rank {} but the communicator has size {} rank {}", tp_size,
                                 options.rank, comm_size, comm_rank));
  }
  // Every rank plans the same split from the same headers (the app gives rank 0 alone a progress callback).
  const plan::TensorParallelPlan tp = plan::plan_tensor_parallel(layer_plan, tp_size, options.expert_parallel);
  LoadProgress progress(tensors, bytes, options.progress);
  const PlannedWeights weights(loaded.checkpoint, layer_plan, progress, &tp, options.rank, prepare);
  loaded.decoder = std::make_unique<Decoder>(loaded.config, weights, std::move(backend), options.comm);
  progress.finish();
  loaded.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return loaded;
}

}  // namespace fp4serve::model
