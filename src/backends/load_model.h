// SPDX-License-Identifier: Apache-2.0
// From a checkpoint folder to a runnable model: make the device's backend (registry.h), open the checkpoint, parse
// its quantization config, plan a scheme per layer for the device, validate every tensor against the schemes'
// contracts, then prepare the weights (reporting progress to a callback) and build the decoder on the backend.
// Downstream of every backend (it picks one); the names stay in fp4serve::model, where they were before the
// backends had their own folder.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "dist/communicator.h"
#include "model/decoder.h"
#include "model/forward_model.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "model/planned_weights.h"

namespace fp4serve::model {

struct LoadOptions {
  /// cpu | cuda. "cuda" plans with the CUDA catalogue of the GPU found and runs the model on it
  /// (backends::cuda::CudaBackend, which needs a build with the CUDA backend). A dry-run name (sm80 … sm120) is
  /// refused with UsageError: it only plans (`fp4serve explain --device smNN`).
  std::string device = "cpu";
  int cuda_device = 0;  ///< the GPU ordinal for --device cuda (a tensor-parallel rank: its local rank)
  std::string activation_quant = "auto";  ///< auto | weight-only | emulate (SCHEMES.md rule 9)
  int threads = 0;                        ///< CPU threads, 0 = all cores
  /// auto | fp32 | bf16 | int8 | int8-decode: how NVFP4 / MXFP4 linears take their activations on the CPU
  /// (prepare::ActivationPrecision: Fp32, Bf16, Int8, Int8Decode; auto: resolve_activation_precision).
  std::string activation_precision = "auto";
  /// bf16 (as stored) | fp8 | int8: the in-memory copy an unquantized lm_head / tied embedding is served from.
  std::string lm_head_dtype = "bf16";
  /// auto | fp32 | bf16 | fp16: the element type of the CPU KV cache (KvCacheDtype); auto follows the
  /// checkpoint's dtype (resolve_kv_cache_dtype).
  std::string kv_cache_dtype = "auto";
  LoadProgressCallback progress;          ///< loading progress reports (empty: none); the library prints nothing
  /// Tensor parallelism (plan/shard.h): this process loads and runs rank `rank`'s shard of
  /// `tensor_parallel_size`; `comm` (kept by the decoder, must outlive it) has that size and rank. nullptr = 1.
  int tensor_parallel_size = 1;
  int rank = 0;
  bool expert_parallel = false;  ///< MoE layers: whole experts per rank instead of split experts
  dist::Communicator* comm = nullptr;
};

struct LoadedModel {
  checkpoint::Checkpoint checkpoint;
  ModelConfig config;
  std::unique_ptr<Decoder> decoder;   ///< the model on its backend (CPU, or CUDA for --device cuda)
  std::vector<std::string> warnings;  ///< plan warnings (downgrades), for the caller to show (the CLI: unless -q)
  double load_seconds = 0.0;
  KvCacheDtype kv_element = KvCacheDtype::F32;  ///< what the decoder's KV caches store
  /// How the FP4 linears take their activations (LoadOptions::activation_precision resolved).
  prepare::ActivationPrecision activation_precision = prepare::ActivationPrecision::Fp32;
};

/// --activation-precision `choice` on `device` for a checkpoint whose dtype is `model_dtype` (ModelConfig::dtype).
/// auto is Bf16 where the CPU kernels run bf16 dot products (kernels::bf16_dot_active(): AVX512-BF16) and the
/// checkpoint is bfloat16, so that prefill runs as the checkpoint's own dtype at twice the fp32 FMA's products per
/// instruction; anything else (another dtype, a CPU without AVX512-BF16, where bf16 would only add a rounding
/// pass, or "cuda") is Fp32. Throws UsageError naming the option for an unknown choice.
prepare::ActivationPrecision resolve_activation_precision(const std::string& choice, const std::string& device,
                                                          const std::string& model_dtype);

/// "fp32", "bf16", "int8" or "int8-decode": the --activation-precision value of `precision`.
const char* activation_precision_name(prepare::ActivationPrecision precision);

/// --kv-cache-dtype `choice` (auto | fp32 | bf16 | fp16) on `device` (LoadOptions::device) as a cache element.
/// auto follows the checkpoint's `model_dtype` (ModelConfig::dtype) as vLLM's `auto` does: bfloat16 → Bf16,
/// float16 → F16, anything else (float32, absent) → F32; the GPU backend's cache is fp32, so auto is F32 there and
/// bf16 / fp16 with device "cuda" are refused. Throws UsageError naming the option for any other choice.
KvCacheDtype resolve_kv_cache_dtype(const std::string& choice, const std::string& device,
                                    const std::string& model_dtype);

/// Loads `dir`. Throws FormatError / UnsupportedError from every stage with the file, tensor or layer named:
/// unreadable checkpoint, unknown architecture, a layer no scheme can run on this device, a contract violation
/// (missing, mis-shaped or unconsumed tensors), bad scales. For --device cuda (checked before any weight is read):
/// UsageError when activation_precision is not fp32 or auto, or lm_head_dtype not bf16 (CPU-only paths), UnsupportedError
/// when the build has no CUDA backend, UsageError when no GPU is found, and what the CUDA
/// backend throws for an op it does not have (naming the op and the layer). Tensor parallelism: UsageError when
/// the size, rank and communicator disagree or the model does not split over that size (naming the valid sizes).
LoadedModel load_model(const std::filesystem::path& dir, const LoadOptions& options);

}  // namespace fp4serve::model
