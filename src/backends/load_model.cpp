// SPDX-License-Identifier: Apache-2.0
#include "backends/load_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <chrono>

#include "backends/cpu/kernels/batch_invariant.h"
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

// The GPU runs fp32 activations, the stored lm_head and an fp32 KV cache: other choices are CPU paths, refused
// rather than ignored.
void refuse_cpu_only_choices(const LoadOptions& options) {
  const bool cpu_precision = options.activation_precision.value_or(prepare::ActivationPrecision::Fp32) !=
                             prepare::ActivationPrecision::Fp32;
  if (options.batch_invariant) {
    throw UsageError(fmt::format("{}: --batch-invariant is a mode of the CPU kernels; the GPU backend has no "
                                 "batch-invariant kernels (use --device cpu)",
                                 options.device == plan::DeviceChoice::Auto ? "--device auto found a GPU"
                                                                            : "--device cuda"));
  }
  if (cpu_precision || options.lm_head_dtype != LmHeadDtype::Bf16) {
    throw UsageError(fmt::format("{}: --activation-precision {} / --lm-head-dtype {} are CPU decode paths; "
                                 "the GPU runs fp32/bf16 (leave both at their defaults, or use --device cpu)",
                                 options.device == plan::DeviceChoice::Auto ? "--device auto found a GPU"
                                                                            : "--device cuda",
                                 options.activation_precision
                                     ? prepare::activation_precision_name(*options.activation_precision)
                                     : "auto",
                                 lm_head_dtype_name(options.lm_head_dtype)));
  }
  (void)resolve_kv_cache_dtype(options.kv_cache_dtype, plan::DeviceKind::Cuda, "");
  if (options.weight_cache == WeightCacheMode::On) {
    throw UsageError("--weight-cache on: the weight cache keeps the CPU's repacked weights; the GPU backend uploads "
                     "the checkpoint's bytes (use auto or off with --device cuda)");
  }
}

// What a cache file is valid for, one fact a line (WeightCache names the first line that changed): this build,
// the checkpoint's files, and the options that change what the repack makes. Taken before the checkpoint is
// opened: a file replaced in between is then named by its old identity beside its new bytes, which only makes the
// next load rewrite the cache (the other order would trust old bytes under a new name). nullopt when any fact
// cannot be read (no /proc/self/exe, an unreadable folder or file): no cache then.
std::optional<std::string> weight_cache_key(const std::filesystem::path& dir, const LoadOptions& options) {
  const std::string executable = executable_identity();
  if (executable == "unknown executable") return std::nullopt;
  std::vector<std::string> files;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; it != end; it.increment(ec)) {
    if (ec) break;
    struct stat st {};
    if (::stat(it->path().c_str(), &st) != 0) return std::nullopt;  // follows the hub's symlinks to their blobs
    if (!S_ISREG(st.st_mode)) continue;
    files.push_back(fmt::format("file {}: {} bytes, device {} inode {}, modified {}.{:09}, changed {}.{:09}",
                                it->path().filename().string(), static_cast<long long>(st.st_size),
                                static_cast<unsigned long long>(st.st_dev), static_cast<unsigned long long>(st.st_ino),
                                static_cast<long long>(st.st_mtim.tv_sec), static_cast<long>(st.st_mtim.tv_nsec),
                                static_cast<long long>(st.st_ctim.tv_sec), static_cast<long>(st.st_ctim.tv_nsec)));
  }
  if (ec || files.empty()) return std::nullopt;
  std::sort(files.begin(), files.end());
  return fmt::format("fp4serve CPU weight cache (prepared_linear.h tile pairs)\nexecutable: {}\n{}\nlm_head_dtype {}, "
                     "activation_quant {}, tensor_parallel_size {}, rank {}, expert_parallel {}",
                     executable, fmt::join(files, "\n"), lm_head_dtype_name(options.lm_head_dtype),
                     plan::activation_quant_name(options.activation_quant), options.parallel.tensor_parallel_size,
                     options.parallel.rank, options.parallel.expert_parallel);
}

// The weight cache of this load, or null: the CPU only, On, or Auto for checkpoints of kWeightCacheAutoBytes or
// more; none without a key or when no cache folder can be named (no $HOME either).
std::shared_ptr<prepare::WeightCache> open_weight_cache(const std::filesystem::path& dir, const LoadOptions& options,
                                                        const std::optional<std::string>& key, uint64_t weight_bytes) {
  const bool wanted = options.weight_cache == WeightCacheMode::On ||
                      (options.weight_cache == WeightCacheMode::Auto && weight_bytes >= kWeightCacheAutoBytes);
  if (!wanted || !key) return nullptr;
  const std::filesystem::path folder =
      !options.weight_cache_dir.empty() ? options.weight_cache_dir
      : cache_directory().empty()       ? std::filesystem::path()
                                        : cache_directory() / "weights";
  if (folder.empty()) return nullptr;
  std::error_code ec;
  std::filesystem::path canonical = std::filesystem::weakly_canonical(dir, ec);
  if (ec) canonical = std::filesystem::absolute(dir, ec);
  if (ec) return nullptr;
  const std::string identity = fmt::format("{}\ntensor_parallel_size {} rank {}", canonical.string(),
                                           options.parallel.tensor_parallel_size, options.parallel.rank);
  std::string label = canonical.filename().string();
  if (options.parallel.tensor_parallel_size > 1) {
    label += fmt::format("-tp{}r{}", options.parallel.tensor_parallel_size, options.parallel.rank);
  }
  return std::make_shared<prepare::WeightCache>(prepare::weight_cache_file(folder, identity, label), *key,
                                                weight_bytes);
}

}  // namespace

std::string_view weight_cache_mode_name(WeightCacheMode mode) {
  switch (mode) {
    case WeightCacheMode::Off: return "off";
    case WeightCacheMode::Auto: return "auto";
    case WeightCacheMode::On: return "on";
  }
  return "?";
}

std::string activation_precision_summary(const LoadedModel& loaded) {
  std::string text(prepare::activation_precision_name(loaded.activation_precision));
  if (loaded.int4_activation_precision != loaded.activation_precision) {
    text += fmt::format(", int4 layers {}", prepare::activation_precision_name(loaded.int4_activation_precision));
  }
  return text;
}

KvCacheDtype resolve_kv_cache_dtype(std::optional<KvCacheDtype> choice, plan::DeviceKind device,
                                    const std::string& model_dtype) {
  const bool gpu = device == plan::DeviceKind::Cuda;
  if (!choice) {
    if (gpu) return KvCacheDtype::F32;
    if (model_dtype == "bfloat16") return KvCacheDtype::Bf16;
    if (model_dtype == "float16") return KvCacheDtype::F16;
    return KvCacheDtype::F32;
  }
  if (gpu && *choice != KvCacheDtype::F32) {
    throw UsageError(fmt::format("--kv-cache-dtype {}: the GPU backend keeps an fp32 KV cache (use auto or fp32 with "
                                 "--device cuda)", kv_cache_dtype_name(*choice)));
  }
  return *choice;
}

LoadedModel load_model(const std::filesystem::path& dir, const LoadOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  // Auto is resolved once here (the GPU when one is found, else the CPU): the plan's catalogue and the backend
  // must be of the same device (a GPU plan loaded onto the CPU backend would refuse what the CPU runs).
  // CPU-only choices are refused for the GPU before anything is detected or read.
  if (options.device == plan::DeviceChoice::Cuda) refuse_cpu_only_choices(options);
  const plan::DeviceCaps device = plan::resolve_device(options.device);  // Cuda without a GPU: the no-GPU message
  const bool gpu = device.kind == plan::DeviceKind::Cuda;
  if (gpu) refuse_cpu_only_choices(options);  // auto found a GPU
  // The plan asks the kernel catalogue of the device that runs the model, the one `explain` asks: nothing is
  // planned that this backend cannot run, and nothing explain accepts is refused here.
  const std::unique_ptr<plan::KernelCatalogue> catalogue = backends::catalogue_for(device);
  plan::PlanOptions plan_options;
  plan_options.catalogue = catalogue.get();
  plan_options.activation_quant = options.activation_quant;
  // The GPU backend is made first, so that a build without one is refused before any weight is read.
  std::unique_ptr<Backend> backend = gpu ? backends::make_cuda_backend(options.cuda_device) : nullptr;
  if (options.threads > 0) core::set_num_threads(options.threads);
  kernels::set_batch_invariant(options.batch_invariant);
  const std::optional<std::string> weight_cache_key_now =
      !gpu && options.weight_cache != WeightCacheMode::Off ? weight_cache_key(dir, options) : std::nullopt;
  LoadedModel loaded{checkpoint::Checkpoint::open(dir), {}, nullptr, {}, 0.0};
  loaded.config = parse_model_config(loaded.checkpoint.config());
  loaded.device = device.kind;
  loaded.kv_element = resolve_kv_cache_dtype(options.kv_cache_dtype, device.kind, loaded.config.dtype);
  PrepareOptions prepare;
  prepare.lm_head_dtype = options.lm_head_dtype;
  const plan::ParallelConfig& parallel = options.parallel;
  const int comm_size = options.comm != nullptr ? options.comm->size() : 1;
  const int comm_rank = options.comm != nullptr ? options.comm->rank() : 0;
  if (parallel.tensor_parallel_size != comm_size || parallel.rank != comm_rank) {
    throw UsageError(fmt::format("tensor_parallel_size {} rank {} but the communicator has size {} rank {}",
                                 parallel.tensor_parallel_size, parallel.rank, comm_size, comm_rank));
  }
  // The AMX probe forks a child (kernels/linear.h amx_status): done here, before the weights fill the address space.
  if (device.kind == plan::DeviceKind::Cpu) (void)kernels::amx_status();
  // auto on the CPU is a measurement: under tensor parallelism rank 0 measures alone (the ranks' probes would
  // compete for the cores) and every rank runs what it chose, so that all shards round their activations alike.
  const bool measured_auto = !options.activation_precision && device.kind == plan::DeviceKind::Cpu;
  if (comm_size == 1 || comm_rank == 0 || !measured_auto) {
    loaded.activation_precision =
        resolve_activation_precision(options.activation_precision, device.kind, loaded.config.dtype,
                                     activation_probe_shape(loaded.config),
                                     options.activation_quant == plan::ActivationQuant::Emulate);
  }
  if (comm_size > 1 && measured_auto) {
    auto code = static_cast<uint8_t>(loaded.activation_precision);
    options.comm->broadcast(&code, 1, 0);
    loaded.activation_precision = static_cast<prepare::ActivationPrecision>(code);
  }
  const plan::LayerPlan layer_plan = plan::build_plan(loaded.checkpoint, plan_options);
  require_complete(layer_plan, dir);
  const bool has_int4 = std::any_of(layer_plan.modules.begin(), layer_plan.modules.end(),
                                    [](const plan::ModulePlan& m) { return m.scheme == plan::SchemeId::W4A16Int4; });
  loaded.int4_activation_precision =
      has_int4 ? choose_int4_activation_precision(options.activation_precision, device.kind, loaded.activation_precision,
                                                  options.activation_quant == plan::ActivationQuant::Emulate)
                     .precision
               : loaded.activation_precision;
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
  std::shared_ptr<prepare::WeightCache> weight_cache;
  if (backend == nullptr) {
    weight_cache = open_weight_cache(dir, options, weight_cache_key_now, bytes);
    backend = backends::make_cpu_backend(loaded.kv_element, loaded.activation_precision, weight_cache,
                                         loaded.int4_activation_precision);
  }
  // Every rank plans the same split from the same headers (the app gives rank 0 alone a progress callback).
  const plan::TensorParallelPlan tp = plan::plan_tensor_parallel(layer_plan, parallel.tensor_parallel_size, parallel.expert_parallel);
  LoadProgress progress(tensors, bytes, options.progress);
  const PlannedWeights weights(loaded.checkpoint, layer_plan, progress, &tp, parallel.rank, prepare);
  loaded.decoder = std::make_unique<Decoder>(loaded.config, weights, std::move(backend), options.comm);
  if (weight_cache != nullptr) loaded.weight_cache = weight_cache->finish();
#ifdef __GLIBC__
  // The heap pages the load freed (reordered expert slices, the parts of fused groups before they were
  // concatenated, parsed headers) go back to the system: glibc keeps freed pages below live allocations resident
  // otherwise, and on a 20B MoE that was gigabytes beside the weights.
  malloc_trim(0);
#endif
  progress.finish();
  loaded.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return loaded;
}

}  // namespace fp4serve::model
