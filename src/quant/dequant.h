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

namespace fp4serve::quant {

/// How a checkpoint stores the NVFP4 per-tensor scale (FORMATS.md §2.1, §3.2).
enum class GlobalScaleConvention {
  Divisor,     ///< compressed-tensors `weight_global_scale` = 448·6/amax: w = q · (s / gs), the division in fp32
  Multiplier,  ///< ModelOpt `weight_scale_2` = amax/(448·6): w = q · (s · ws2), the product in fp32
};

/// A dequantized [N, K] weight. Every value is exactly representable in `dtype` (the reference's output dtype).
struct DequantizedWeight {
  core::DType dtype = core::DType::BF16;  ///< BF16, F16 or F32
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> values;  ///< [rows, cols] row-major
};

/// NVFP4: `weight_packed` [N, K/2] U8, `weight_scale` [N, K/16] F8_E4M3, `global_scale` finite and > 0.
/// Output BF16 (compressed-tensors decompresses FP4 to BF16 even for FP16 models, FORMATS.md §2.1). With the
/// Multiplier convention the code −0 decodes to +0 as ModelOpt's `NVFP4QTensor.dequantize` does.
/// Throws FormatError naming `name` on a dtype/shape mismatch or a zero/NaN/Inf global scale.
DequantizedWeight dequantize_nvfp4(const core::TensorView& weight_packed, const core::TensorView& weight_scale,
                                   float global_scale, GlobalScaleConvention convention, std::string_view name);

/// MXFP4: `weight_packed` [N, K/2] U8, `weight_scale` [N, K/32] U8 or F8_E8M0. Output BF16: w = q · 2^(b−127)
/// rounded once to BF16 (compressed-tensors builds the scale in BF16, so the product is exact unless it leaves
/// BF16's range). Throws FormatError naming `name` on a dtype/shape mismatch.
DequantizedWeight dequantize_mxfp4(const core::TensorView& weight_packed, const core::TensorView& weight_scale,
                                   std::string_view name);

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
