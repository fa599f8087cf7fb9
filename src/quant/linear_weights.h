// SPDX-License-Identifier: Apache-2.0
// A Linear layer's weights as the checkpoint stores them, handed from the model to a backend: the tensors of one
// module, or of several modules fused along N (q|k|v, gate|up), each possibly a tensor-parallel shard or one expert
// of a fused 3-D tensor, in checkpoint order and dtype. No device layout: each backend repacks from this into its
// own at upload (the CPU's tile pairs: backends/cpu/prepare; the GPU's MMA fragments: backends/cuda/kernels/
// gpu_layout.h), so a new device reads the checkpoint's layouts, not another device's. This is how vLLM keeps
// checkpoint-layout parameters until the chosen kernel's process_weights_after_loading repacks them.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor_view.h"
#include "quant/block_format.h"

namespace fp4serve::quant {

/// How the weight tensors of every row block of a LinearWeights are encoded.
enum class WeightEncoding : uint8_t {
  /// A block format (quant/block_format.h: NVFP4, MXFP4). weight: weight_packed [N, K/2] U8 (low nibble = even
  /// column); weight_scale: [N, K/g] in one of the format's scale dtypes; a format with a global scale uses
  /// WeightRows::global_scale in LinearWeights::convention.
  Fp4,
  /// compressed-tensors int4 pack-quantized. weight: weight_packed [N, ceil(K/8)] I32 (nibble = q + 8);
  /// weight_scale: [N, ceil(K/group_size)] (or [N, 1] for channel) BF16/F16/F32; zero_point [ceil(N/8), G] I32
  /// (optional); g_idx [K] I32 (optional, activation order).
  Int4,
  /// FP8 E4M3 weight-only. weight: [N, K] F8_E4M3; weight_scale: [] / [1] (tensor), [N] / [N, 1] (channel), or
  /// [ceil(N/bh), ceil(K/bw)] with LinearWeights::fp8_block = {bh, bw}.
  Fp8,
  /// Unquantized. weight: [N, K] BF16, F16 or F32.
  Dense,
};
const char* weight_encoding_name(WeightEncoding encoding);  ///< "FP4", "INT4", "FP8", "dense"

/// A run choice for an unquantized weight (--lm-head-dtype): keep it as stored, or re-encode it in memory with one
/// scale per output row. Backends that cannot re-encode refuse the layer at upload.
enum class DenseRequant : uint8_t {
  None,
  Fp8Rows,   ///< E4M3 per output row, s = amax_row/448
  Int8Rows,  ///< int8 per output row, s = amax_row/127
};

/// The tensors of one module (or its shard, or one expert of it): rows [offset, offset + N) of the layer.
/// Views point into the mapped checkpoint or into bytes LinearWeights::owned keeps alive.
struct WeightRows {
  std::string name;               ///< the module path (with "expert E" / a shard note), for messages
  core::TensorView weight;        ///< see WeightEncoding
  core::TensorView weight_scale;  ///< empty shape and bytes for Dense
  core::TensorView zero_point;    ///< Int4 only; has_zero_point false otherwise
  core::TensorView g_idx;         ///< Int4 only; has_g_idx false otherwise
  bool has_zero_point = false;
  bool has_g_idx = false;
  /// Fp4 formats with a global scale: CT `weight_global_scale` (Divisor) or ModelOpt `weight_scale_2`
  /// (Multiplier), as stored; 0 otherwise.
  float global_scale = 0.f;
  core::TensorView bias;  ///< [N] BF16/F16/F32 when has_bias
  bool has_bias = false;

  /// N: the rows these tensors hold (dimension 0 of `weight`; 0 when it has none).
  int64_t out_features() const { return weight.shape.empty() ? 0 : weight.shape[0]; }
};

/// One Linear layer y = x·Wᵀ (+ bias), W = [out_features, in_features], as row blocks stacked along N in order.
/// Move-only (the views may point into `owned`).
struct LinearWeights {
  WeightEncoding encoding = WeightEncoding::Dense;
  BlockFormat block_format = BlockFormat::Nvfp4;                   ///< Fp4 only
  GlobalScaleConvention convention = GlobalScaleConvention::Divisor;  ///< Fp4 formats with a global scale
  int64_t in_features = 0;                                          ///< K
  int64_t group_size = -1;  ///< Int4: the config's group size (−1 = channel); unused otherwise
  std::array<int64_t, 2> fp8_block{0, 0};  ///< Fp8 block scales {bh, bw}; {0, 0} for tensor / channel scales
  DenseRequant requant = DenseRequant::None;  ///< Dense only
  /// W4A4 checkpoints: the activations' global scale in the compressed-tensors divisor form; 0 = absent.
  float input_global_scale = 0.f;
  std::vector<WeightRows> rows;
  /// Bytes the views of `rows` point into other than the checkpoint's mapping (TP slices, expert slices, the
  /// dequantized weights of an emulated W4A4 layer).
  std::vector<std::shared_ptr<const void>> owned;

  LinearWeights() = default;
  LinearWeights(LinearWeights&&) noexcept = default;
  LinearWeights& operator=(LinearWeights&&) noexcept = default;
  LinearWeights(const LinearWeights&) = delete;
  LinearWeights& operator=(const LinearWeights&) = delete;

  /// Σ N of the row blocks.
  int64_t out_features() const;
  /// Keeps `bytes` alive as long as these weights and returns a view of them with `dtype` and `shape`.
  core::TensorView keep(std::vector<std::byte> bytes, core::DType dtype, std::vector<int64_t> shape);
};

/// An unquantized weight [N, K] that owns a copy of `values` (row-major fp32), for tests and in-memory layers.
LinearWeights dense_weights(std::vector<float> values, int64_t out_features, int64_t in_features, std::string name);
/// An unquantized layer over `weight` [N, K] BF16/F16/F32 (and `bias` [N] when not null), not copied: their bytes
/// must outlive the result. Throws FormatError (check_dense_rows).
LinearWeights dense_view_weights(const core::TensorView& weight, std::string name,
                                 const core::TensorView* bias = nullptr);

/// A block-format layer over `weight_packed` and `weight_scale` (not copied: their bytes must outlive the result),
/// `global_scale` as stored (formats without one ignore it). Throws FormatError (check_fp4_rows).
LinearWeights fp4_view_weights(BlockFormat format, const core::TensorView& weight_packed,
                               const core::TensorView& weight_scale, float global_scale,
                               GlobalScaleConvention convention, std::string name);

/// A W4A4 checkpoint's activation global scale in the compressed-tensors divisor form (Multiplier → 1/value in
/// fp32, FORMATS.md §3.2). Throws FormatError unless value is finite and > 0.
float input_global_scale_divisor(float value, GlobalScaleConvention convention);
/// Records it on `w` (input_global_scale_divisor). Throws as that.
void set_input_global_scale(LinearWeights& w, float value, GlobalScaleConvention convention);

/// The row blocks of `parts` stacked in order into one layer (fused q|k|v, gate|up): each keeps its own tensors,
/// global scale and bias. Throws UsageError on an empty list or parts that differ in encoding, block format,
/// in_features, group size, FP8 block, requant or global-scale convention; FormatError when their
/// input_global_scales differ (fused layers quantize one activation).
LinearWeights stack_rows(std::vector<LinearWeights> parts);

/// Validates one block-format row block: weight_packed [N, K/2] U8 with N, K > 0 and K a multiple of the group,
/// weight_scale [N, K/g] in one of the format's scale dtypes, no NaN E4M3 block scale (0x7F/0xFF), and a global
/// scale that is finite and > 0 where the format has one. Returns K. Throws FormatError naming `name`, the tensor,
/// the expected and the found value.
int64_t check_fp4_rows(BlockFormat format, const core::TensorView& weight_packed, const core::TensorView& weight_scale,
                       float global_scale, GlobalScaleConvention convention, std::string_view name);

/// Validates a dense row block: [N, K] BF16/F16/F32 with N, K > 0. Returns K. Throws FormatError naming `name`.
int64_t check_dense_rows(const core::TensorView& weight, std::string_view name);

/// Throws FormatError "<name>: <role> <message>".
[[noreturn]] void fail_tensor(std::string_view name, std::string_view role, const std::string& message);
/// dtype ∈ allowed, no negative dimension, byte count = ceil(numel · bits / 8); throws FormatError naming `name`
/// and `role`.
void check_tensor_dtype(const core::TensorView& t, std::span<const core::DType> allowed, std::string_view name,
                        std::string_view role);
/// Exact shape match; throws FormatError with expected and found shapes.
void check_tensor_shape(const core::TensorView& t, const std::vector<int64_t>& expected, std::string_view name,
                        std::string_view role);

}  // namespace fp4serve::quant
