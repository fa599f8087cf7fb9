// SPDX-License-Identifier: Apache-2.0
// Reference dequantization of checkpoint tensors, bit-exact with the producers' own decompression
// (compressed-tensors `decompress`, ModelOpt `NVFP4QTensor.dequantize`): FORMATS.md §2 and §3.2. This is the
// oracle for parity tests and for `quantize` round trips, not a fast path: kernels have their own.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor_view.h"
#include "quant/block_format.h"

namespace fp4serve::quant {

/// A dequantized [N, K] weight. Every value is exactly representable in `dtype` (the reference's output dtype).
struct DequantizedWeight {
  core::DType dtype = core::DType::BF16;  ///< BF16, F16 or F32
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> values;  ///< [rows, cols] row-major
};

/// A block format (quant/block_format.h): `weight_packed` [N, K/2] U8, `weight_scale` [N, K/g] in one of the
/// row's scale dtypes (NVFP4: F8_E4M3, g = 16; MXFP4: U8 or F8_E8M0, g = 32). Formats with a global scale take
/// `global_scale` (finite, non-zero) under `convention`; others ignore both. Output BF16, the dtype
/// compressed-tensors decompresses FP4 to even for FP16 models (FORMATS.md §2.1): w = q · t rounded once, with
/// t = s / gs (divisor), s · gs (multiplier) or s, in fp32. With the Multiplier convention the code −0 decodes
/// to +0 as ModelOpt's `NVFP4QTensor.dequantize` does. Throws FormatError naming `name` on a dtype/shape
/// mismatch, K not a multiple of the group size, or a zero/NaN/Inf global scale.
DequantizedWeight dequantize_block(BlockFormat format, const core::TensorView& weight_packed,
                                   const core::TensorView& weight_scale, float global_scale,
                                   GlobalScaleConvention convention, std::string_view name);

inline DequantizedWeight dequantize_nvfp4(const core::TensorView& weight_packed, const core::TensorView& weight_scale,
                                          float global_scale, GlobalScaleConvention convention, std::string_view name) {
  return dequantize_block(BlockFormat::Nvfp4, weight_packed, weight_scale, global_scale, convention, name);
}
inline DequantizedWeight dequantize_mxfp4(const core::TensorView& weight_packed, const core::TensorView& weight_scale,
                                          std::string_view name) {
  return dequantize_block(BlockFormat::Mxfp4, weight_packed, weight_scale, 0.0f, GlobalScaleConvention::Divisor, name);
}

/// compressed-tensors pack-quantized int4: `weight_packed` [N, ceil(K/8)] I32, `weight_scale` [N, G] (group),
/// [N, 1] (channel) or [1] (tensor) in BF16/F16/F32, optional `zero_point` [ceil(N/8), G] I32 packed along rows
/// (null when symmetric), optional `g_idx` [K] I32 (actorder "group"; null otherwise). `in_features` is K from
/// `weight_shape`. w = round_to_scale_dtype((q − z) · scale[n, group(k)]). Output dtype = the scale's dtype.
/// Throws FormatError naming `name` on a dtype/shape mismatch or a g_idx entry outside [0, G).
DequantizedWeight dequantize_int4(const core::TensorView& weight_packed, const core::TensorView& weight_scale,
                                  const core::TensorView* zero_point, const core::TensorView* g_idx,
                                  int64_t in_features, int64_t group_size, std::string_view name);

/// FP8 E4M3 weights: `weight` [N, K] F8_E4M3, `weight_scale` [] / [1] (tensor), [N] / [N, 1] (channel) or
/// [ceil(N/bh), ceil(K/bw)] (block; pass `block_rows`/`block_cols`, else 0) in BF16/F16/F32.
/// w = round_to_scale_dtype(fp8 · s). Throws FormatError naming `name` on a dtype/shape mismatch.
DequantizedWeight dequantize_fp8(const core::TensorView& weight, const core::TensorView& weight_scale,
                                 int64_t block_rows, int64_t block_cols, std::string_view name);

/// Reads element `i` of a BF16, F16 or F32 tensor as float. Throws FormatError for other dtypes.
float load_float(const core::TensorView& t, size_t i, std::string_view name);

}  // namespace fp4serve::quant
