// SPDX-License-Identifier: Apache-2.0
// Native W4A4 NVFP4 and MXFP4 on SM100/SM120 (Blackwell FP4 tensor cores) through cuBLASLt's block-scaled
// matmul: CUDA_R_4F_E2M1 operands with CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 (NVFP4) or
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 (MXFP4: the E8M0 exponents as stored, one per 32) scales. NEVER RUN: no Blackwell GPU has
// been available; it compiles always and is selected only when the device reports sm ≥ 100 (linear_w4a4 in
// linear_cuda.h). Host-facing (g++).
//
// cuBLASLt computes D = Σ (q_w·s_w)(q_x·s_x) over K with both operands K-major ("TN"): the weight is A (op T,
// the checkpoint's [N, K/2] packing: two codes per byte, even column in the low nibble), the activations are B.
// Its block scales must be in the tiled "128×4" layout of the cuBLAS documentation (section "1D Block Scaling
// Factors Layout"): a scale matrix [rows, cols] (rows = N or m, cols = K/16) is padded to multiples of 128 × 4
// and cut into 128×4 blocks of 512 bytes, stored block-row by block-row; inside a block, row r and column c sit
// at (r % 32)·16 + (r / 32)·4 + c. The per-row weight global scale, the 1/igs of the activation step and the bias
// are applied afterwards by the same epilogue order as the emulation ((D / igs) / gs or · ws2, + bias; MXFP4 has
// neither global scale nor igs, only the bias).
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cuda/kernels/device.h"
#include "backends/cuda/kernels/fp4_math.h"  // FP4SERVE_HD
#include "quant/linear_weights.h"
#include "quant/block_format.h"

namespace fp4serve::kernels::cuda {

/// Byte offset of scale (row, col) in the tiled 128×4 layout of a scale matrix with `cols` columns (the padded
/// column count is ⌈cols/4⌉·4). Host and device (act_quant.cu writes the activation scales with it).
FP4SERVE_HD inline int64_t block_scale_offset(int64_t row, int64_t col, int64_t cols) {
  const int64_t col_blocks = (cols + 3) / 4;
  return ((row / 128) * col_blocks + col / 4) * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + col % 4;
}

/// Bytes of a tiled scale matrix: ⌈rows/128⌉·128 · ⌈cols/4⌉·4.
inline int64_t block_scale_bytes(int64_t rows, int64_t cols) { return (rows + 127) / 128 * 128 * ((cols + 3) / 4 * 4); }

/// The FP4 weight of `w` in cuBLASLt's operand layout, on the host: codes [N, K/2] (checkpoint packing) and the
/// block scales tiled (block_scale_offset; padding 0): E4M3 [N, K/16] for NVFP4, E8M0 [N, K/32] for MXFP4.
/// Throws what Fp4Rows (gpu_layout.h) throws, UnsupportedError when its format has no cuBLASLt scale mode
/// (native_fp4_supports).
struct NativeFp4Weight {
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales;
};
NativeFp4Weight pack_native_fp4(const quant::LinearWeights& w);
class Fp4Rows;
/// The same from rows already read and validated (gpu_layout.h).
NativeFp4Weight pack_native_fp4(const Fp4Rows& rows);

/// True when cuBLASLt has a block-scale mode for `format` (one E4M3 per 16 or one E8M0 per 32: NVFP4, MXFP4);
/// layers of other formats run the W4A4 emulation.
bool native_fp4_supports(quant::BlockFormat format);

/// True when the device can run the native path: sm ≥ 100 and cuBLASLt ≥ 12.8 (block-scaled FP4 matmul).
bool native_fp4_available(const DeviceInfo& device);

}  // namespace fp4serve::kernels::cuda
