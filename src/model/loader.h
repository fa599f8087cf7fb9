// SPDX-License-Identifier: Apache-2.0
// From a checkpoint folder to a runnable model: open the checkpoint, parse its quantization config, plan a
// scheme per layer for the device, validate every tensor against the schemes' contracts, then prepare the
// weights (reporting progress to a callback) and build the decoder.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "dist/communicator.h"
#include "model/decoder.h"
#include "model/forward_model.h"
#include "model/model_config.h"
#include "model/planned_weights.h"

namespace fp4serve::model {

struct LoadOptions {
  /// cpu | cuda | sm80 … sm120. "cuda" plans for the GPU found and runs the model on it (model::CudaBackend,
  /// which needs a build with the CUDA backend); a GPU name plans only (dry run: the CPU backend runs).
  std::string device = "cpu";
  int cuda_device = 0;  ///< the GPU ordinal for --device cuda (a tensor-parallel rank: its local rank)
  std::string activation_quant = "auto";  ///< auto | weight-only | emulate (SCHEMES.md rule 9)
  int threads = 0;                        ///< CPU threads, 0 = all cores
  /// fp32 | int8 | int8-decode: how NVFP4 / MXFP4 linears take their activations on the CPU
  /// (prepare::ActivationPrecision: Fp32, Int8, Int8Decode).
  std::string activation_precision = "fp32";
  /// bf16 (as stored) | fp8 | int8: the in-memory copy an unquantized lm_head / tied embedding is served from.
  std::string lm_head_dtype = "bf16";
  /// auto | fp32 | bf16 | fp16: the element type of the CPU KV cache (kernels::KvElement); auto follows the
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
  kernels::KvElement kv_element = kernels::KvElement::F32;  ///< what the decoder's KV caches store
};

/// --kv-cache-dtype `choice` (auto | fp32 | bf16 | fp16) on `device` (LoadOptions::device) as a cache element.
/// auto follows the checkpoint's `model_dtype` (ModelConfig::dtype) as vLLM's `auto` does: bfloat16 → Bf16,
/// float16 → F16, anything else (float32, absent) → F32; the GPU backend's cache is fp32, so auto is F32 there and
/// bf16 / fp16 with device "cuda" are refused. Throws UsageError naming the option for any other choice.
kernels::KvElement resolve_kv_cache_dtype(const std::string& choice, const std::string& device,
                                          const std::string& model_dtype);

/// Loads `dir`. Throws FormatError / UnsupportedError from every stage with the file, tensor or layer named:
/// unreadable checkpoint, unknown architecture, a layer no scheme can run on this device, a contract violation
/// (missing, mis-shaped or unconsumed tensors), bad scales. For --device cuda (checked before any weight is read):
/// UsageError when activation_precision is not fp32 or lm_head_dtype not bf16 (CPU-only paths), UnsupportedError
/// when the build has no CUDA backend, UsageError when no GPU is found, and what the CUDA
/// backend throws for an op it does not have (naming the op and the layer). Tensor parallelism: UsageError when
/// the size, rank and communicator disagree or the model does not split over that size (naming the valid sizes).
LoadedModel load_model(const std::filesystem::path& dir, const LoadOptions& options);

}  // namespace fp4serve::model
