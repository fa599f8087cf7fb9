// SPDX-License-Identifier: Apache-2.0
// y = x·Wᵀ (+ bias) on the GPU for FP4 block formats (NVFP4, MXFP4; weight-only: FP4 weights decoded in
// registers, bf16 activations, tensor-core bf16 MMA with fp32 accumulation) and Dense bf16 (cuBLAS) layers, plus
// the W4A4 emulation. Host-facing: compiles with plain g++. Uploads repack from the checkpoint order the model hands
// over (quant/linear_weights.h). The CPU kernels (backends/cpu/kernels/linear.h) are the oracle:
// tests/backends/cuda/kernels/linear_cuda_test.cpp compares the two on the same checkpoint tensors.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backends/cuda/kernels/device.h"
#include "quant/linear_weights.h"

namespace fp4serve::kernels::cuda {

using bf16 = __nv_bfloat16;

/// One Linear layer resident on the GPU, made by upload_linear. Move-only.
/// - Fp4 (`block_format` NVFP4, MXFP4): `codes` and `scales` in the GPU layout of gpu_layout.h; a format with a
///   global scale (NVFP4) adds `global_scale` [padded_rows] fp32 as stored in the checkpoint (padding 1) and its
///   `convention`.
/// - Dense: `dense` = [N, K] bf16 row-major (F16 / F32 checkpoint weights are rounded to bf16 with RNE at upload:
///   the GPU runs them as bf16, so results differ from the CPU's fp32 weights by that rounding).
/// `bias` = [N] fp32 or empty.
struct DeviceLinear {
  quant::WeightEncoding layout = quant::WeightEncoding::Dense;  ///< Fp4 or Dense
  quant::BlockFormat block_format = quant::BlockFormat::Nvfp4;  ///< Fp4 layout only: the format of codes and scales
  int64_t out_features = 0;  ///< N
  int64_t in_features = 0;   ///< K
  int64_t padded_rows = 0;   ///< Np (FP4), N (Dense)
  int64_t padded_cols = 0;   ///< Kp (FP4), K (Dense)
  int64_t group_size = 0;    ///< the block format's group size (Fp4), 0 (Dense)
  quant::GlobalScaleConvention convention = quant::GlobalScaleConvention::Divisor;
  float input_global_scale = 0.f;  ///< W4A4 checkpoints (divisor convention); 0 = absent
  /// A layer of a format whose W4A4 activations have per-call scales only (MXFP4, w4a4_input_global_scale false)
  /// uploaded for W4A4: its activations are quantized in its format (linear_w4a4).
  bool dynamic_w4a4 = false;
  DeviceBuffer<uint32_t> codes;
  DeviceBuffer<uint8_t> scales;
  DeviceBuffer<float> global_scale;
  DeviceBuffer<float> bias;
  DeviceBuffer<bf16> dense;
  /// W4A4 layers on sm ≥ 100 only (native_fp4.h): codes [N, K/2] and tiled E4M3 (NVFP4) or E8M0 (MXFP4) scales
  /// for cuBLASLt.
  DeviceBuffer<uint8_t> native_codes;
  DeviceBuffer<uint8_t> native_scales;

  /// Device bytes of the weights (codes + scales + global scales, or the dense matrix); bias excluded.
  int64_t weight_bytes() const;
};

/// Repacks `w` (checkpoint order) into the GPU layout and copies it to the device (synchronous; `stream` is reserved for an
/// asynchronous upload). W4A4 layers — NVFP4 with an input_global_scale, MXFP4 uploaded with `dynamic_w4a4` —
/// also get the native cuBLASLt operands when the current device has FP4 tensor cores (native_fp4_available) and
/// cuBLASLt scales the format (native_fp4_supports).
/// Throws UnsupportedError for Int4 and Fp8 layers and dense layers re-encoded per row (--lm-head-dtype fp8 /
/// int8): no CUDA kernel yet; FormatError for malformed tensors (quant::check_fp4_rows, check_dense_rows);
/// UsageError for `dynamic_w4a4` on a layer whose format is not dynamic W4A4 (only MXFP4); DeviceError when a
/// CUDA call fails.
DeviceLinear upload_linear(const quant::LinearWeights& w, Stream& stream, bool dynamic_w4a4 = false);

/// y[i, n] = Σ_k x[i, k]·W[n, k] (+ bias[n]) for i < m, queued on `stream` (asynchronous).
/// x: [m, K] bf16 row-major, device memory, 16-byte aligned. y: [m, N] row-major device memory, fp32 or bf16
/// (rounded once, RNE, from the fp32 result). m ≥ 0; m = 0 does nothing.
/// FP4: block scales are applied to the weights before the MMA (code·scale is exact in bf16), the NVFP4 global
/// scale once per output in the epilogue in the CPU's order (acc / gs for Divisor, acc · ws2 for Multiplier,
/// then + bias). m ≤ 16 runs the decode kernel (one 16-row weight tile per warp, split-K inside the block when
/// N is small); larger m runs the same MMA core with 64 tokens per warp, split over K across blocks when the grid
/// would not fill the GPU (backends/cuda/kernels/partition.h; the partial sums are added in a fixed order, so results
/// are deterministic, and the per-thread workspace is allocated once, at the first m > 16 call: do one such call
/// before capturing a CUDA graph; calls from one host thread on two streams must not overlap, they share that
/// workspace). Dense: cuBLAS bf16 GEMM (fp32 compute).
/// Throws UsageError for null or misaligned pointers with m > 0 or m < 0, DeviceError when a launch fails.
void linear(const DeviceLinear& w, const bf16* x, int64_t m, float* y, Stream& stream);
void linear(const DeviceLinear& w, const bf16* x, int64_t m, bf16* y, Stream& stream);

/// W4A4 emulation on the GPU (ActivationEmulation::EmulateNvfp4 of backends/cpu/kernels/linear.h): each row's 16-column
/// groups of x are fake-quantized exactly as kernels::emulate_nvfp4_activations does (shared scalar code, fp4_math.h),
/// then multiplied by the weights. The quantized activations are kept as bf16(code·s_a) — exact — in `scratch`
/// (resized to m·K when smaller) and the 1/igs of the step s_a/igs is applied in the epilogue (acc / igs), so
/// the result differs from the CPU only by fp32 rounding order. x, y, m, stream as for linear().
/// MXFP4 layers uploaded with `dynamic_w4a4` (ActivationEmulation::EmulateMxfp4): 32-column groups quantized as
/// kernels::emulate_mxfp4_activations does (fp4_math.h emulate_mxfp4_group on the bf16 x), no activation factor.
/// Throws UsageError when the layer is neither (NVFP4 with an input_global_scale, MXFP4 W4A4), or K is not a
/// multiple of the group.
void linear_w4a4_emulated(const DeviceLinear& w, const bf16* x, int64_t m, float* y, DeviceBuffer<bf16>& scratch,
                          Stream& stream);

/// Scratch of linear_w4a4, grown on demand and reused across calls (one per stream).
struct W4A4Scratch {
  DeviceBuffer<bf16> activations;   ///< emulation: bf16(code·s_a) [m, K]
  DeviceBuffer<uint8_t> codes;      ///< native: packed activation codes [m, K/2]
  DeviceBuffer<uint8_t> scales;     ///< native: tiled activation scales
  DeviceBuffer<float> product;      ///< native: cuBLASLt output before the epilogue [m, N]
  DeviceBuffer<uint8_t> workspace;  ///< native: cuBLASLt workspace
};

/// W4A4 NVFP4 or MXFP4 with the semantics of linear_w4a4_emulated: on a device with FP4 tensor cores (sm ≥ 100, the layer
/// uploaded there) through cuBLASLt's block-scaled FP4 matmul on the quantized activations — NEVER RUN so far —
/// otherwise the emulation. Same arguments and errors as linear_w4a4_emulated; y is fp32 [m, N].
void linear_w4a4(const DeviceLinear& w, const bf16* x, int64_t m, float* y, W4A4Scratch& scratch, Stream& stream);

/// out[i, k] = bf16(E2M1 code · s_a) for x [m, K] bf16 per 16-column group, on the device: the W4A4 activation
/// quantization of linear_w4a4_emulated without its 1/igs factor. x and out: device memory, 16-byte aligned, may
/// be equal. Throws UsageError unless K % 16 == 0 and igs is finite > 0, or for null pointers with m > 0.
void quantize_activations_nvfp4(const bf16* x, int64_t m, int64_t k, float input_global_scale, bf16* out,
                                Stream& stream);

/// out[i, k] = bf16(E2M1 code · 2^(e − 127)) for x [m, K] bf16 per 32-column group (the MXFP4 W4A4 fake quant,
/// exact in bf16). x and out as for quantize_activations_nvfp4. Throws UsageError unless K % 32 == 0, or for null
/// or misaligned pointers with m > 0.
void quantize_activations_mxfp4(const bf16* x, int64_t m, int64_t k, bf16* out, Stream& stream);

}  // namespace fp4serve::kernels::cuda
