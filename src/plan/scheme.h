// SPDX-License-Identifier: Apache-2.0
// Execution schemes (docs/SCHEMES.md "Schemes"), the checkpoint variants they serve, the predicates that map a
// LayerQuant to a variant (SCHEMES.md rule 1), and each scheme's parameter contract: the checkpoint tensors it
// consumes with dtypes and shape formulas (rule 6).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/architecture.h"
#include "core/dtype.h"
#include "plan/device_caps.h"
#include "quant/block_format.h"
#include "quant/quant_config.h"

namespace fp4serve::plan {

enum class SchemeId : uint8_t {
  W4A4Nvfp4,          ///< NVFP4 weights, activations quantized to NVFP4 at run time (FP4 MMA)
  W4A16Nvfp4,         ///< NVFP4 weights, 16/32-bit activations
  W4A4Nvfp4Emulated,  ///< NVFP4 weights, activations quantized→dequantized exactly as the reference; fp32 math
  W4A4Mxfp4,          ///< MXFP4 weights and dynamic MXFP4 activations (FP4 MMA)
  W4A4Mxfp4Emulated,  ///< MXFP4 weights, activations quantized→dequantized to MXFP4 exactly as the reference; fp32 math
  W4A16Mxfp4,         ///< MXFP4 weights, 16/32-bit activations
  W4A16Int4,          ///< int4 pack-quantized weights, 16/32-bit activations
  W8A8Fp8,            ///< FP8 weights and activations (FP8 MMA)
  W8A16Fp8,           ///< FP8 weights, 16/32-bit activations
  Unquantized,        ///< bf16/fp16/fp32 weights
};
/// "W4A4_NVFP4", … as SCHEMES.md spells them.
std::string_view scheme_name(SchemeId id);

/// The checkpoint side of a layer, decided by the predicates of classify_layer.
enum class Variant : uint8_t {
  Unquantized,
  Nvfp4W4A4,   ///< NVFP4 weights + NVFP4 activations (CT nvfp4 W4A4, ModelOpt NVFP4)
  Nvfp4W4A16,  ///< NVFP4 weights only (CT nvfp4a16, ModelOpt W4A16_NVFP4)
  Mxfp4W4A4,   ///< MXFP4 weights + MXFP4 activations
  Mxfp4W4A16,  ///< MXFP4 weights only (CT mxfp4a16, GPT-OSS native)
  Int4W4A16,   ///< int4 pack-quantized, no activation quant
  Fp8W8A8,     ///< FP8 weights + FP8 activations
  Fp8W8A16,    ///< FP8 weights only
};
std::string_view variant_name(Variant v);

/// What a layer's weights are, apart from the parameters of their format. Code that differs by kind switches on
/// this; facts that differ by block format come from the format's row (quant/block_format.h).
enum class WeightKind : uint8_t {
  Unquantized,  ///< bf16/fp16/fp32
  Block,        ///< a block format: NVFP4, MXFP4 (`block` names it)
  Int4,         ///< int4 pack-quantized, group or channel scales from the config
  Fp8,          ///< FP8 E4M3, tensor / channel / block scales from the config
};

/// What a scheme does with the activations.
enum class ActivationMode : uint8_t {
  None,      ///< 16/32-bit activations (weight-only)
  Native,    ///< quantized at run time for the device's FP4/FP8 matrix units
  Emulated,  ///< quantized→dequantized exactly as the reference does, fp32 math
};

/// The checkpoint side of a layer: one row per Variant.
struct VariantTraits {
  Variant id;
  std::string_view name;  ///< "NVFP4 W4A4"
  WeightKind weights;
  std::optional<quant::BlockFormat> block;  ///< set exactly when weights == Block
  bool activations;                         ///< the checkpoint quantizes activations (W4A4 / W8A8)
};
const VariantTraits& variant_traits(Variant v);
/// The variant of weights `kind` in `block` with or without activation quantization. Throws when no
/// row has that combination (UnsupportedError).
Variant find_variant(WeightKind kind, std::optional<quant::BlockFormat> block, bool activations);

/// One row per scheme: what it runs, in which format, and what it does with activations.
struct SchemeTraits {
  SchemeId id;
  std::string_view name;
  WeightKind weights;
  std::optional<quant::BlockFormat> block;  ///< set exactly when weights == Block
  ActivationMode activations;
  bool quantizes_activations;  ///< uses the checkpoint's activation scales (else they are dropped) = activations != None
};
const SchemeTraits& scheme_traits(SchemeId id);
/// The scheme that runs `kind` / `block` with `activations`; nullopt when there is none (FP8 emulation).
std::optional<SchemeId> find_scheme(WeightKind kind, std::optional<quant::BlockFormat> block, ActivationMode activations);

/// True when `v` quantizes activations in the checkpoint (W4A4 / W8A8).
bool variant_has_activation_quant(Variant v);

/// Rule 1: maps a module's quantization to a variant, checking type, num_bits, strategy, group_size, symmetric,
/// dynamic, scale_dtype and the storage format together. Throws UnsupportedError naming `module` and every field
/// for any other combination (FP4 weights with FP8/int8/mismatched FP4 activations, MXFP8, int8, fake-quant
/// `dense` weights, output activation quant, int widths other than 4, quantized fused 3-D experts outside
/// GPT-OSS native MXFP4).
Variant classify_layer(const quant::LayerQuant& quant, const checkpoint::ModuleInfo& module);


// --- parameter contracts (rule 6) -----------------------------------------------------------------------------

enum class TensorRole : uint8_t {
  Weight,             ///< dense or FP8 weight, or ModelOpt packed FP4 `weight`
  WeightPacked,       ///< CT `weight_packed`, GPT-OSS `_blocks`
  WeightScale,        ///< per-group / channel / tensor / block scale
  WeightGlobalScale,  ///< CT `weight_global_scale` (divisor) or ModelOpt `weight_scale_2` (multiplier)
  WeightZeroPoint,
  WeightShape,        ///< CT int `weight_shape` [2]
  WeightGIdx,         ///< CT actorder=group `weight_g_idx`
  InputGlobalScale,   ///< CT `input_global_scale` (divisor) / ModelOpt NVFP4 `input_scale` (multiplier)
  InputScale,         ///< FP8 static activation scale
  Bias,
  TransformMatrix,    ///< online transform `P.<group>_<location>.weight`
  TransformPerm,
};
std::string_view tensor_role_name(TensorRole r);


/// One tensor a scheme consumes from the checkpoint.
struct TensorContract {
  std::string name;                          ///< full tensor name
  TensorRole role = TensorRole::Weight;
  std::vector<core::DType> dtypes;           ///< accepted storage dtypes
  std::vector<std::vector<int64_t>> shapes;  ///< accepted shapes (e.g. a scalar as [1] or [])
  std::string formula;                       ///< "[N, K/16]" with the symbols of FORMATS.md
  bool required = true;                      ///< false: may be absent (an optional buffer)
  bool dropped = false;                      ///< read and validated, then released (e.g. a downgrade's input scale)
  bool shared = false;                       ///< also consumed by another module (tied lm_head)
};

/// The contract of `scheme` for `module` quantized as `quant` (classified as `variant`). Problems that the
/// config alone shows (K not divisible by the group size) are appended to `problems`. Tensor names follow the
/// producer (CT `weight_packed`, ModelOpt `weight` + `weight_scale_2`, GPT-OSS `_blocks`/`_scales`).
std::vector<TensorContract> parameter_contract(SchemeId scheme, Variant variant, const quant::LayerQuant& quant,
                                               const checkpoint::ModuleInfo& module, std::vector<std::string>& problems);

/// The global-scale convention of a quantized module's tensors (CT stores divisors, 448·6/amax; ModelOpt
/// multipliers, amax/(448·6)); nullopt when the variant's format has no global scale.
std::optional<quant::GlobalScaleConvention> global_scale_convention(Variant variant, const quant::LayerQuant& quant);

}  // namespace fp4serve::plan
