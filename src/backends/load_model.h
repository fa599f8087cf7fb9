// SPDX-License-Identifier: Apache-2.0
// From a checkpoint folder to a runnable model: make the device's backend (registry.h), open the checkpoint, parse
// its quantization config, plan a scheme per layer for the device, validate every tensor against the schemes'
// contracts, then prepare the weights (reporting progress to a callback) and build the decoder on the backend.
// Downstream of every backend (it picks one); the names stay in fp4serve::model, where they were before the
// backends had their own folder.
#pragma once

#include <array>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/activation_precision.h"
#include "backends/cpu/prepare/prepared_linear.h"
#include "backends/cpu/prepare/weight_cache.h"
#include "checkpoint/checkpoint.h"
#include "dist/communicator.h"
#include "model/decoder.h"
#include "model/forward_model.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "model/planned_weights.h"
#include "plan/device_caps.h"
#include "plan/select.h"
#include "plan/shard.h"

namespace fp4serve::model {

/// Whether the CPU keeps its repacked weights on disk for later loads to map (prepare/weight_cache.h).
enum class WeightCacheMode : uint8_t {
  Off,
  /// On for checkpoints of at least kWeightCacheAutoBytes of weights, where a load's page clearing costs seconds;
  /// smaller ones load in well under a second without one and would only fill the cache folder.
  Auto,
  On,
};
inline constexpr uint64_t kWeightCacheAutoBytes = uint64_t{256} << 20;
/// "off", "auto", "on".
std::string_view weight_cache_mode_name(WeightCacheMode mode);

/// What a run chose (the app parses the command line into these: app/option_values.h); nothing here is text.
struct LoadOptions {
  /// The device that runs the model. Cuda plans with the CUDA catalogue of the GPU found and runs the model on it
  /// (backends::cuda::CudaBackend, which needs a build with the CUDA backend); Auto is the GPU when one is found,
  /// else the CPU. Dry-run devices (explain --device smNN) only plan and cannot be named here.
  plan::DeviceChoice device = plan::DeviceChoice::Cpu;
  int cuda_device = 0;  ///< the GPU ordinal for Cuda (a tensor-parallel rank: its local rank)
  plan::ActivationQuant activation_quant = plan::ActivationQuant::Auto;  ///< SCHEMES.md rule 9
  int threads = 0;                                                       ///< CPU threads, 0 = all cores
  /// How NVFP4 / MXFP4 linears take their activations on the CPU; std::nullopt = auto
  /// (resolve_activation_precision).
  std::optional<prepare::ActivationPrecision> activation_precision;
  /// The in-memory copy an unquantized lm_head / tied embedding is served from (Bf16: as stored).
  LmHeadDtype lm_head_dtype = LmHeadDtype::Bf16;
  /// The element type of the KV cache; std::nullopt = auto, the checkpoint's dtype (resolve_kv_cache_dtype).
  std::optional<KvCacheDtype> kv_cache_dtype;
  /// Batch-invariant CPU kernels (backends/cpu/kernels/batch_invariant.h, `--batch-invariant`): each row's logits
  /// do not depend on the other rows of its step, how its prompt was chunked or the thread count, so greedy tokens
  /// and logprobs are the same alone and batched. A process-wide switch: load_model sets it to this value (the
  /// model loaded last decides). Refused for the GPU (UsageError).
  bool batch_invariant = false;
  /// The CPU's weight cache (`--weight-cache`; the CLI's default is Auto): one file per checkpoint folder and
  /// tensor-parallel rank in `weight_cache_dir` (empty: cache_directory() / "weights"), keyed by this executable,
  /// the checkpoint files' sizes and modification times, and the options that change the repack. On is refused
  /// for the GPU (UsageError); Auto does nothing there.
  WeightCacheMode weight_cache = WeightCacheMode::Off;
  std::filesystem::path weight_cache_dir;
  LoadProgressCallback progress;  ///< loading progress reports (empty: none); the library prints nothing
  /// Tensor parallelism (plan/shard.h): this process loads and runs rank `parallel.rank`'s shard of
  /// `parallel.tensor_parallel_size`; `comm` (kept by the decoder, must outlive it) has that size and rank.
  /// nullptr = a single process.
  plan::ParallelConfig parallel;
  dist::Communicator* comm = nullptr;
};

struct LoadedModel {
  checkpoint::Checkpoint checkpoint;
  ModelConfig config;
  std::unique_ptr<Decoder> decoder;   ///< the model on its backend (CPU, or CUDA for --device cuda)
  std::vector<std::string> warnings;  ///< plan warnings (downgrades), for the caller to show (the CLI: unless -q)
  double load_seconds = 0.0;
  plan::DeviceKind device = plan::DeviceKind::Cpu;  ///< where the model runs (LoadOptions::device, Auto resolved)
  KvCacheDtype kv_element = KvCacheDtype::F32;  ///< what the decoder's KV caches store
  /// How the FP4 linears take their activations (LoadOptions::activation_precision resolved).
  prepare::ActivationPrecision activation_precision = prepare::ActivationPrecision::Fp32;
  /// How the int4 linears take theirs (choose_int4_activation_precision; activation_precision when it has none).
  prepare::ActivationPrecision int4_activation_precision = prepare::ActivationPrecision::Fp32;
  /// What the weight cache did, when one was used (LoadOptions::weight_cache).
  std::optional<prepare::WeightCacheReport> weight_cache = std::nullopt;
};

/// The activation precisions of `loaded` for start-up lines: "bf16", or "bf16-decode-int8, int4 layers int8" where
/// its int4 layers take another.
std::string activation_precision_summary(const LoadedModel& loaded);

/// The KV cache element `choice` means on `device`. Auto (std::nullopt) follows the checkpoint's `model_dtype` as
/// vLLM's `auto` does: bfloat16 → Bf16, float16 → F16, anything else (float32, absent) → F32; the GPU backend's
/// cache is fp32, so auto is F32 there and Bf16 / F16 on the GPU are refused (UsageError naming the option).
KvCacheDtype resolve_kv_cache_dtype(std::optional<KvCacheDtype> choice, plan::DeviceKind device,
                                    const std::string& model_dtype);

/// Loads `dir`. Throws FormatError / UnsupportedError from every stage with the file, tensor or layer named:
/// unreadable checkpoint, unknown architecture, a layer no scheme can run on this device, a contract violation
/// (missing, mis-shaped or unconsumed tensors), bad scales. For the GPU (checked before any weight is read):
/// UsageError when activation_precision is neither auto nor Fp32, or lm_head_dtype not Bf16 (CPU-only paths), UnsupportedError
/// when the build has no CUDA backend, UsageError when no GPU is found, and what the CUDA
/// backend throws for an op it does not have (naming the op and the layer). Tensor parallelism: UsageError when
/// the size, rank and communicator disagree or the model does not split over that size (naming the valid sizes).
LoadedModel load_model(const std::filesystem::path& dir, const LoadOptions& options);

}  // namespace fp4serve::model
