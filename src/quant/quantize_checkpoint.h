// SPDX-License-Identifier: Apache-2.0
// Whole-checkpoint quantization behind `fp4serve quantize`: reads an unquantized Hugging Face folder, chooses
// the linear layers to quantize, computes fused-group global scales, and writes a compressed-tensors folder
// laid out as llm-compressor's `save_pretrained(save_compressed=True)` writes it (FORMATS.md §1–§2).
// The per-tensor math is in quant/quantize.h; this file is the plan (which tensors, which names, which config)
// and the streaming writer around it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors_writer.h"
#include "core/dtype.h"
#include "quant/gptq.h"

namespace fp4serve::quant {

/// The llm-compressor preset schemes `fp4serve quantize` writes (CT `quant_scheme.py`).
enum class QuantScheme {
  Nvfp4,     ///< NVFP4 weights + NVFP4 activations (needs a calibrated `input_global_scale`)
  Nvfp4A16,  ///< NVFP4 weights, 16-bit activations
  Mxfp4,     ///< MXFP4 weights + dynamic MXFP4 activations (nothing to calibrate)
  Mxfp4A16,  ///< MXFP4 weights, 16-bit activations
  W4A16,     ///< int4 symmetric group quantization (group 128 unless told otherwise), 16-bit activations
};

/// Parses the CLI spelling ("nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16", "w4a16"); std::nullopt when unknown.
std::optional<QuantScheme> parse_quant_scheme(std::string_view name);
/// The CLI spelling of `scheme`.
std::string_view quant_scheme_name(QuantScheme scheme);

/// How the codes are chosen: round-to-nearest (llm-compressor QuantizationModifier) or GPTQ (GPTQModifier,
/// quant/gptq.h) on the same grid.
enum class QuantMethod { Rtn, Gptq };
/// Parses "rtn" / "gptq"; std::nullopt when unknown.
std::optional<QuantMethod> parse_quant_method(std::string_view name);
std::string_view quant_method_name(QuantMethod method);

/// Hessians of the inputs of the quantized linears by module name; modules that share an input (q|k|v, gate|up)
/// share one accumulator.
using HessianMap = std::map<std::string, std::shared_ptr<const GptqHessian>>;

/// Modules left unquantized unless the caller gives its own list: the output head and MoE routers, which
/// llm-compressor recipes exclude (`"lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$"`, …).
/// Entries are exact module names or `re:` + a regex matched at the start of the name (Python `re.match`).
std::vector<std::string> default_ignore_patterns();

struct QuantizeOptions {
  QuantScheme scheme = QuantScheme::Nvfp4A16;
  /// W4A16 group size; 0 = the preset's 128. NVFP4 (16) and MXFP4 (32) have fixed groups.
  int64_t group_size = 0;
  /// Exact names / `re:` patterns of linear modules to keep unquantized; replaces default_ignore_patterns().
  std::optional<std::vector<std::string>> ignore;
  uint64_t max_shard_bytes = checkpoint::kDefaultMaxShardBytes;
  /// NVFP4 W4A4 only: calibrated max |input activation| per quantized module name (static min-max over the
  /// calibration tokens). Required for every quantized module with that scheme; ignored otherwise.
  std::map<std::string, float> input_amax;
  /// QuIP-style Hadamard block size (16, 32, 64 or 128), 0 = none. Every quantized linear's weight is rotated
  /// W ← W·H_b/√b block-diagonally (compressed-tensors `weight_input`, inverse) before quantization, and the
  /// checkpoint declares the matching online `input` transform (group "v", type "hadamard", head_dim b) with one
  /// stored ±1 Sylvester matrix (compressed-tensors ties same-size matrices). With NVFP4 W4A4, `input_amax` must
  /// be observed on the transformed activations (app/calibration.h does).
  int64_t hadamard = 0;
  QuantMethod method = QuantMethod::Rtn;
  GptqOptions gptq;  ///< GPTQ settings (method Gptq)
  /// GPTQ only: the calibration Hessian of every quantized module's input, observed after the `hadamard` transform
  /// when there is one (app/calibration.h). Required for every quantized module with method Gptq.
  HessianMap hessians;
};

/// One linear layer (a 2-D `<module>.weight` under `model.layers.`, or `lm_head`).
struct LinearPlan {
  std::string module;       ///< e.g. "model.layers.0.self_attn.q_proj"
  core::DType dtype = core::DType::BF16;
  int64_t rows = 0;         ///< out_features N
  int64_t cols = 0;         ///< in_features K
  bool quantized = false;
  std::string fused_group;  ///< modules sharing an NVFP4 global scale share this key; empty when not fused
  float global_scale = 0;   ///< NVFP4 weight_global_scale (set by plan_quantization for NVFP4 schemes)
  float input_global_scale = 0;  ///< NVFP4 W4A4 input_global_scale
};

struct QuantizePlan {
  QuantScheme scheme = QuantScheme::Nvfp4A16;
  int64_t group_size = 0;                ///< the effective group size (16, 32 or the int4 group)
  std::vector<LinearPlan> linears;       ///< in natural name order
  std::vector<std::string> ignore;       ///< every unquantized linear by exact name, as llm-compressor lists them
  int64_t hadamard = 0;                  ///< QuantizeOptions::hadamard
  QuantMethod method = QuantMethod::Rtn; ///< QuantizeOptions::method
  GptqOptions gptq;                      ///< QuantizeOptions::gptq
  HessianMap hessians;                   ///< QuantizeOptions::hessians
};

/// `w` [rows, cols] ← w · blockdiag(H_b)/√b, computed in float64 and rounded to `dtype` (BF16/F16 via f32, as
/// torch casts float64 → f32 → bf16), as compressed-tensors fuses an inverse `weight_input` Hadamard
/// (`apply_transform_weight`: value @ H.T, divided by √b). Throws UsageError unless b is a power of two ≥ 2
/// dividing cols.
void rotate_weight_hadamard(std::vector<float>& w, int64_t rows, int64_t cols, int64_t block, core::DType dtype);

/// Decides what to quantize in `source`. For NVFP4 schemes it also reads the quantized weights once to compute
/// the global scales, jointly over the fusion groups llm-compressor uses (LLMC `FUSED_LAYER_NAMES`: q/k/v,
/// gate/up, q_a/kv_a_with_mqa, w1/w3 siblings), and the W4A4 input global scales from `input_amax`.
/// Throws UsageError when the source already carries a quantization config, a quantized layer's in_features is
/// not a multiple of the group size (the message suggests --ignore), an option is out of range, an ignore
/// regex is invalid, an `input_amax` entry is missing for W4A4, or a Hessian is missing (or of the wrong width)
/// for GPTQ; UnsupportedError for a weight dtype other than
/// BF16/F16/F32 or a 3-D (fused-expert) weight under `model.layers.`.
QuantizePlan plan_quantization(const checkpoint::Checkpoint& source, const QuantizeOptions& options);

/// The `quantization_config` object llm-compressor writes for `plan` (FORMATS.md §1.2, §1.6): quant_method,
/// version, format, quantization_status "compressed", one config group targeting "Linear", the ignore list.
nlohmann::json quantization_config(const QuantizePlan& plan);

/// Called after each quantized linear with (done, total, module name); with GPTQ after that layer's GPTQ.
using QuantizeProgress = std::function<void(size_t, size_t, std::string_view)>;

/// Writes the quantized checkpoint into `out_dir` (created if missing): shards + index when more than one shard,
/// config.json with `quantization_config`, and copies of the tokenizer, chat template and generation files.
/// Weights are quantized one shard at a time, so memory stays near one shard's worth.
/// Throws UsageError when `out_dir` is the source folder or already holds model*.safetensors files, IoError when a
/// file cannot be written, and whatever plan_quantization throws.
void quantize_checkpoint(const checkpoint::Checkpoint& source, const QuantizePlan& plan,
                         const std::filesystem::path& out_dir, uint64_t max_shard_bytes,
                         const QuantizeProgress& progress = {});

}  // namespace fp4serve::quant
