// SPDX-License-Identifier: Apache-2.0
// Internal interface between the host dispatch (linear_cuda.cpp, g++) and the kernels (gemm_fp4.cu,
// act_quant.cu, nvcc): plain structs and launch functions; no CUDA syntax. Not a public API.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant/block_format.h"

namespace fp4serve::kernels::cuda {

/// Arguments of the FP4 MMA kernel (layouts in gpu_layout.h; sizes already validated by the caller).
struct Fp4GemmArgs {
  const uint32_t* codes = nullptr;   ///< [Np/16][Kp/64][32][4]
  const uint8_t* scales = nullptr;   ///< [Np/16][Kp/64][S][2]
  /// Format of the scales: its row gives the group size (S = gpu_scale_slots of it) and the scale element.
  quant::BlockFormat format = quant::BlockFormat::Nvfp4;
  const float* global_scale = nullptr;  ///< [Np] or null
  bool divisor = true;               ///< global scale divides (compressed-tensors) or multiplies (ModelOpt)
  float activation_divisor = 0.f;    ///< W4A4 emulation: the output is divided by it first; 0 = none
  const float* bias = nullptr;       ///< [N] or null
  const __nv_bfloat16* x = nullptr;  ///< [m, K]
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t row_tiles = 0;
  int64_t col_chunks = 0;
  float* y_f32 = nullptr;            ///< exactly one of y_f32 / y_bf16 is set: [m, N]
  __nv_bfloat16* y_bf16 = nullptr;
  /// Split-K workspace of the tiled path (m > 16): fp32 [splits, m, N] partial sums; null or too small for the
  /// plan of partition.h = no split. split_k_workspace_floats(SMs) floats always suffice.
  float* split_partial = nullptr;
  int64_t split_partial_floats = 0;
};

/// Whether the W4A4 activations of format f carry a stored per-tensor global scale (its row's `dynamic: local`:
/// NVFP4's input_global_scale) or only per-call block scales (`dynamic: true`: MXFP4).
inline bool w4a4_input_global_scale(quant::BlockFormat f) {
  return quant::block_format_traits(f).input_dynamic == quant::Dynamic::Local;
}

/// Picks the kernel variant (decode for m ≤ 16, tiled otherwise, split over K per partition.h when the
/// workspace allows) and launches it (two kernels when split); checks the launches.
void launch_fp4_gemm(const Fp4GemmArgs& args, int multiprocessors, cudaStream_t stream);

/// W4A4 activation fake quant in groups of `format` (its row: group size g, scale element), m·k/g groups:
/// - E4M3 scales under a global scale (NVFP4): out = bf16(E2M1(x/step)·s_a), step = s_a/igs, per fp4_math.h
///   (nvfp4_activation_scale; the 1/igs is left to the GEMM epilogue);
/// - E8M0 scales (MXFP4): out = bf16(E2M1(x/s)·s), s = 2^(e − 127) of fp4_math.h (exact in bf16; a NaN quotient
///   stays NaN); input_global_scale unused.
/// Checks the launch.
void launch_quantize_activations(quant::BlockFormat format, const __nv_bfloat16* x, int64_t m, int64_t k,
                                 float input_global_scale, __nv_bfloat16* out, cudaStream_t stream);

/// Native W4A4 activation quantization in groups of `format`: codes [m, K/2] (two per byte, even column low) and
/// the scale bytes (E4M3 for NVFP4, the E8M0 exponents e for MXFP4: cuBLASLt VEC16_UE4M3 / VEC32_UE8M0) in the
/// tiled 128×4 layout (native_fp4.h) of a [m, K/g] matrix; `scales` must be zeroed first (padding).
void launch_quantize_activations_packed(quant::BlockFormat format, const __nv_bfloat16* x, int64_t m, int64_t k,
                                        float input_global_scale, uint8_t* codes, uint8_t* scales,
                                        cudaStream_t stream);

/// y[i, n] = ((d[i, n] / activation_divisor) ⊘ gs[n]) + bias[n] (⊘ = divide or multiply by the convention),
/// the W4A4 epilogue after cuBLASLt; gs and bias may be null.
void launch_w4a4_epilogue(const float* d, int64_t m, int64_t n, float activation_divisor, const float* global_scale,
                          bool divisor, const float* bias, float* y, cudaStream_t stream);

/// y[i, n] = bias[n] for i < m (fp32 or bf16 output): the C input of a cuBLAS GEMM with beta = 1.
void launch_broadcast_bias(const float* bias, int64_t m, int64_t n, float* y_f32, __nv_bfloat16* y_bf16,
                           cudaStream_t stream);

}  // namespace fp4serve::kernels::cuda
