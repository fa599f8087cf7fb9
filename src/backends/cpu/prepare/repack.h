// SPDX-License-Identifier: Apache-2.0
// Checkpoint tensors (docs/FORMATS.md layouts) → PreparedLinear (the CPU kernels' layout), once at load: the CPU
// backend's repack of the checkpoint-order weights the model hands it (quant/linear_weights.h, prepare_linear).
// Every function validates dtypes and shapes first and throws FormatError naming `name` (the module path,
// e.g. "model.layers.0.self_attn.q_proj") with the expected and the found value; nothing is read out of bounds.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/tensor_view.h"
#include "quant/linear_weights.h"
#include "backends/cpu/prepare/prepared_linear.h"

namespace fp4serve::prepare {

/// The CPU layout of a layer in checkpoint order: each row block prepared by the function of its encoding below
/// (with its bias and the layer's input_global_scale), then concatenated (concat_rows). With `arena`, the weight
/// buffers of the result (codes, scales, offsets) are built in it directly (ScopedWeightArena). Throws what those
/// throw.
PreparedLinear prepare_linear(const quant::LinearWeights& w, HugePageArena* arena = nullptr);

/// A block format (quant/block_format.h): compressed-tensors `<format>-pack-quantized`, ModelOpt NVFP4 /
/// W4A16_NVFP4, GPT-OSS blocks reshaped to 2-D (FORMATS.md §2.1, §2.2, §3.2, §5).
/// weight_packed: [N, K/2] U8 (low nibble = even column); weight_scale: [N, K/g] in one of the row's scale dtypes
/// (NVFP4: F8_E4M3, g = 16; MXFP4: U8 or F8_E8M0, g = 32, 255 decoding to +inf as in the references).
/// Formats with a global scale take `global_scale`: CT `weight_global_scale` (Divisor) or ModelOpt
/// `weight_scale_2` (Multiplier); others ignore it and `convention`.
/// Throws FormatError on wrong dtype/shape, K not a multiple of g, a NaN E4M3 block scale (0x7F/0xFF), or a
/// global scale that is zero, negative, NaN or Inf.
PreparedLinear prepare_fp4(quant::BlockFormat format, const core::TensorView& weight_packed,
                           const core::TensorView& weight_scale, float global_scale, GlobalScaleConvention convention,
                           std::string_view name);

inline PreparedLinear prepare_nvfp4(const core::TensorView& weight_packed, const core::TensorView& weight_scale,
                                    float global_scale, GlobalScaleConvention convention, std::string_view name) {
  return prepare_fp4(quant::BlockFormat::Nvfp4, weight_packed, weight_scale, global_scale, convention, name);
}
inline PreparedLinear prepare_mxfp4(const core::TensorView& weight_packed, const core::TensorView& weight_scale,
                                    std::string_view name) {
  return prepare_fp4(quant::BlockFormat::Mxfp4, weight_packed, weight_scale, 0.f, GlobalScaleConvention::Divisor, name);
}

/// int4 pack-quantized (CT, FORMATS.md §0.4, §2.3). weight_packed: [N, ceil(K/8)] I32 (nibble = q + 8);
/// weight_scale: [N, G] BF16/F16/F32 with G = ceil(K/group_size), or [N, 1] when group_size = −1 (channel);
/// zero_point: [ceil(N/8), G] I32 packed along rows (nibble = z + 8) or null (symmetric);
/// g_idx: [K] I32 group of each input column (actorder "group") or null.
/// Throws FormatError on wrong dtype/shape/g_idx values; UnsupportedError when K or group_size is not a
/// multiple of 8, or when g_idx does not give every group exactly group_size columns (the last group: the rest).
PreparedLinear prepare_int4(const core::TensorView& weight_packed, const core::TensorView& weight_scale,
                            const core::TensorView* zero_point, const core::TensorView* g_idx, int64_t in_features,
                            int64_t group_size, std::string_view name);

/// FP8 E4M3 weight-only (CT naive/float-quantized, ModelOpt FP8, DeepSeek block FP8; FORMATS.md §2.4).
/// weight: [N, K] F8_E4M3; weight_scale (BF16/F16/F32, a multiplier): [] or [1] (tensor), [N] or [N, 1]
/// (channel), or [ceil(N/bh), ceil(K/bw)] when block = {bh, bw} (both > 0; {0, 0} otherwise).
/// Throws FormatError on wrong dtype/shape; UnsupportedError when a scale is so large (> 2^7) that the
/// kernel's exponent fold would overflow fp32.
PreparedLinear prepare_fp8(const core::TensorView& weight, const core::TensorView& weight_scale,
                           std::array<int64_t, 2> block, std::string_view name);

/// Unquantized weight [N, K] BF16 (kept as bf16), F16 or F32 (stored as fp32). Throws FormatError.
PreparedLinear prepare_dense(const core::TensorView& weight, std::string_view name);

/// An unquantized weight [N, K] (BF16, F16 or F32) re-encoded in memory as the Fp8 layout with one fp32 scale per
/// row: s = amax_row/448 (1 for an all-zero row), code = E4M3(w / s) with RNE (quant::float_to_e4m3). For
/// `--lm-head-dtype fp8`; 1 byte per weight instead of 2 (bf16) or 4. Throws FormatError on wrong dtype/shape.
PreparedLinear prepare_dense_as_fp8_rows(const core::TensorView& weight, std::string_view name);

/// The same weight as the Int8 layout: s = amax_row/127 (1 for an all-zero row), code = round-to-nearest-even(w / s)
/// ∈ [−127, 127]. For `--lm-head-dtype int8`. Throws FormatError on wrong dtype/shape.
PreparedLinear prepare_dense_as_int8_rows(const core::TensorView& weight, std::string_view name);

/// Adds bias [N] BF16/F16/F32 (converted exactly to fp32). Throws FormatError on wrong dtype/shape.
void attach_bias(PreparedLinear& w, const core::TensorView& bias, std::string_view name);

/// Records a W4A4 checkpoint's activation global scale, converted to the compressed-tensors divisor form
/// (Multiplier → 1/value in fp32, FORMATS.md §3.2). Throws FormatError unless value is finite and > 0.
void set_input_global_scale(PreparedLinear& w, float value, GlobalScaleConvention convention);

/// Fuses layers that read the same input (q/k/v, gate/up) into one with the rows of `parts` in order.
/// All parts must share layout, K, group size, dense storage, global-scale convention and activation order;
/// each NVFP4 part keeps its own per-row global scale (never merged by max). A part without bias gets zero
/// bias when another part has one. Throws UsageError on an empty list or mismatched parts, FormatError when
/// input_global_scales differ, UnsupportedError when a part other than the last has N not a multiple of
/// kTileRows.
PreparedLinear concat_rows(std::vector<PreparedLinear> parts);

}  // namespace fp4serve::prepare
