// SPDX-License-Identifier: Apache-2.0
// Weight quantization exactly as llm-compressor + compressed-tensors produce it (docs/FORMATS.md §2): the
// producer side of the formats that dequant.h reads back. Pure functions over float arrays; the CLI
// (`fp4serve quantize`) reads the weights, groups fused layers and writes the results.
//
// Bit-exactness depends on reproducing the producer's arithmetic, including the dtype each step runs in.
// llm-compressor observes a weight in its own dtype (the `source` dtype below: BF16, F16 or F32), so the
// steps written "in source" are one fp32 operation rounded to that dtype, as torch does for BF16/F16 tensors on
// CPU. Each step cites the compressed-tensors (CT) or llm-compressor (LLMC) function it follows (CT 0.19.0,
// LLMC 0.14.0.1, the versions that wrote tests/data/ref/*).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "quant/block_format.h"

namespace fp4serve::quant {

/// Group sizes fixed by the block formats (quant/block_format.h) and the W4A16 preset default (FORMATS.md §1.2).
inline constexpr int64_t kNvfp4GroupSize = block_format_traits(BlockFormat::Nvfp4).group_size;
inline constexpr int64_t kMxfp4GroupSize = block_format_traits(BlockFormat::Mxfp4).group_size;
inline constexpr int64_t kInt4DefaultGroupSize = 128;

/// NVFP4 weight in compressed-tensors layout (`nvfp4-pack-quantized`).
struct QuantizedNvfp4 {
  int64_t rows = 0;            ///< N (out_features)
  int64_t cols = 0;            ///< K (in_features)
  std::vector<uint8_t> packed; ///< `weight_packed` [N, K/2] U8, element 2j in the low nibble
  std::vector<uint8_t> scales; ///< `weight_scale` [N, K/16] F8_E4M3 bytes, never 0 (0 → 0.125)
  float global_scale = 1.0f;   ///< `weight_global_scale` [1] F32 (divisor convention, 448·6/amax)
};

/// MXFP4 weight in compressed-tensors layout (`mxfp4-pack-quantized`).
struct QuantizedMxfp4 {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> packed;  ///< `weight_packed` [N, K/2] U8
  std::vector<uint8_t> scales;  ///< `weight_scale` [N, K/32] U8 E8M0 codes (value 2^(code−127))
};

/// Symmetric int4 group quantization in compressed-tensors `pack-quantized` layout (W4A16).
struct QuantizedInt4 {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;
  std::vector<int32_t> packed;  ///< `weight_packed` [N, ceil(K/8)] I32, nibble = q + 8, element 0 in the low bits
  std::vector<float> scales;    ///< `weight_scale` [N, K/G], every value exact in `scale_dtype`
  core::DType scale_dtype = core::DType::BF16;  ///< = the source dtype (CT stores the scale in the weight dtype)
};

/// max |x| over `values` (0 for an empty span), the amax every scale below starts from.
/// Throws UsageError naming `name` and the element index when a value is NaN or ±inf: no producer can give such a
/// weight a finite scale.
float abs_max(std::span<const float> values, std::string_view name);

/// NVFP4 global scale for a tensor (or fused group) whose max |value| is `amax`, as llm-compressor computes
/// it (CT `generate_gparam`, LLMC `Observer.get_global_scale`): 448·6 / max(amax, tiny) evaluated in the source
/// dtype as torch evaluates `2688.0 / tensor`, i.e. round(round(1/amax) · 2688), then widened to F32; a NaN/inf
/// result becomes 1.0. For BF16 and F32 this is exactly the producer's
/// value. For F16 the producer's arithmetic overflows (448·6/amax > 65504 whenever amax < 0.041, and the
/// result silently becomes 1.0, ruining the block scales); we evaluate F16 in F32 instead and say so here.
/// The same formula gives the W4A4 `input_global_scale` from the calibrated activation amax.
/// Throws UsageError when `source` is not BF16, F16 or F32, or `amax` is negative or NaN.
float nvfp4_global_scale(float amax, core::DType source);

/// NVFP4 (FORMATS.md §2.1) of the row-major [rows, cols] weight `w` whose values are exact in `source`.
/// Per 16-element group g of row n (CT `calculate_qparams` then `_quantize`, `pack_fp4_to_uint8`):
///   s_local = amax_g / 6                      (in source)
///   s       = E4M3(clamp(gs · s_local, ±448)) (the product in F32; RNE), 0 → 0.125
///   v       = w / (s / gs)                    (both divisions in F32)
///   code    = E2M1 RNE of clamp(v, ±6); a zero result keeps the sign of a nonzero negative v (code 0x8) but
///             w = ±0 gives 0x0 (torch.sign(−0.0) is +0).
/// `global_scale` is the (possibly fused-group) value from nvfp4_global_scale.
/// Throws UsageError when rows or cols ≤ 0, cols % 16 ≠ 0, w.size() ≠ rows·cols, `global_scale` is not finite
/// and > 0, or `source` is not BF16/F16/F32.
QuantizedNvfp4 quantize_nvfp4(std::span<const float> w, int64_t rows, int64_t cols, float global_scale,
                              core::DType source);

/// E8M0 code of an MXFP4 group whose max |value| is `amax` (CT `generate_mx_scales`, `round_to_power_2`):
/// R = amax rounded to a power of two, up only when the two leading mantissa bits are set (mantissa ≥ 1.75);
/// code = clamp(127 + log2(R) − 2, 0, 255); amax = 0 (log2 → −inf) gives 0. The rounding acts on the bits of
/// amax in the source dtype; for BF16 and F32 sources the result only depends on the value.
/// Throws UsageError when `source` is not BF16, F16 or F32.
uint8_t mxfp4_scale_code(float amax, core::DType source);

/// MXFP4 (FORMATS.md §2.2): per 32-element group, code = mxfp4_scale_code(amax_g), v = w / 2^(code−127) (in
/// source), E2M1 code as for NVFP4. Throws UsageError on a size/shape mismatch, cols % 32 ≠ 0 or a bad `source`.
QuantizedMxfp4 quantize_mxfp4(std::span<const float> w, int64_t rows, int64_t cols, core::DType source);

/// Symmetric int4 group quantization (W4A16 preset; FORMATS.md §2.3), CT `calculate_qparams` and `_quantize`:
///   scale = amax_g / 7.5 (in source; 7.5 = half of the int4 range [−8, 7]); 0 → eps of the source dtype
///   q     = clamp(round_half_even(w / scale (in source)), −8, 7)
/// The division result is rounded to the source dtype BEFORE rounding to an integer, as torch does for BF16.
/// Throws UsageError on a size/shape mismatch, group_size ≤ 0, cols % group_size ≠ 0 or a bad `source`.
QuantizedInt4 quantize_int4(std::span<const float> w, int64_t rows, int64_t cols, int64_t group_size,
                            core::DType source);

}  // namespace fp4serve::quant
