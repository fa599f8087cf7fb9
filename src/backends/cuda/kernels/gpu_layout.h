// SPDX-License-Identifier: Apache-2.0
// The GPU weight layout of NVFP4 / MXFP4 Linear layers and its host-side repack from the checkpoint's layout
// (quant/linear_weights.h: weight_packed [N, K/2], block scales [N, K/g]). Pure host code (g++), so the layout is
// unit-tested without a GPU; upload_linear (linear_cuda.h) copies the result to the device once at load.
//
// The FP4 kernel (gemm_fp4.cu) multiplies 16×16 weight tiles by activation tiles with the tensor-core
// instruction mma.sync.m16n8k16 (bf16 in, fp32 accumulate). Weights are the A operand: output features are the
// MMA's M dimension, so one decoded weight tile serves up to 8 tokens per instruction (the decode GEMV) or many.
// The layout is chosen so that every lane of a warp loads its whole A fragment for 64 columns with one
// coalesced 16-byte load and decodes it with shifts only:
// - N is padded to Np = 16·⌈N/16⌉ (row tiles rt) and K to Kp = 64·⌈K/64⌉ (column chunks c); padding is zero.
// - codes = [Np/16][Kp/64][32 lanes][4 words] uint32. For lane l (g = l/4, t = l%4), word j ∈ 0..3 is the A
//   fragment of MMA step j; its nibble i ∈ 0..7 is the E2M1 code of
//     row = 16·rt + g + 8·(i & 1),   column = 64·c + 16·t + 4·j + (i >> 2) + 2·((i >> 1) & 1).
//   The MMA's k index of nibble i is 2t + 8·((i >> 1) & 1) + (i >> 2), so the map from MMA k to column is a
//   permutation inside each chunk (the sum over k does not care), chosen so that lane (g, t) needs the
//   activations of the 16 consecutive columns 64c + 16t … +15 (two 16-byte loads), and nibbles i and i + 4 (bits
//   4i and 4i + 16) form one bf16x2 register of the fragment, extracted by one shift and two masks.
// - scales = [Np/16][Kp/64][S][2] bytes, the checkpoint's block-scale bytes unchanged. Lane (g, t) covers 16
//   columns per row, inside one group of G columns (G from the block format's row, quant/block_format.h: a
//   multiple of 16 dividing 64), so it needs 2 scale bytes per chunk: byte 0 for row g, byte 1 for row g + 8.
//   With P = 64/G groups per chunk, S = 8·P slots and lane l reads slot l/(G/16) = group P·c + t/(G/16) of row g:
//   NVFP4 (G = 16) S = 32, slot l = group 4c + t; MXFP4 (G = 32) S = 16, slot l/2 = group 2c + t/2. Padded rows
//   and columns hold 0.
#pragma once

#include <cstdint>
#include <vector>

#include "quant/linear_weights.h"
#include "quant/block_format.h"

namespace fp4serve::kernels::cuda {

inline constexpr int64_t kGpuRowTile = 16;   ///< output features per MMA tile
inline constexpr int64_t kGpuColChunk = 64;  ///< columns per 16-byte code load of one lane
inline constexpr int64_t kGpuLaneCols = kGpuColChunk / 4;  ///< columns of one row a lane covers per chunk

/// Whether a block format's group size fits the scale slots above: a multiple of a lane's columns dividing a chunk.
constexpr bool gpu_layout_supports(int64_t group_size) {
  return group_size >= kGpuLaneCols && group_size % kGpuLaneCols == 0 && kGpuColChunk % group_size == 0;
}
/// Scale slots S per (row tile, chunk) for groups of `group_size` columns: 8 rows g × 64/group_size groups.
constexpr int64_t gpu_scale_slots(int64_t group_size) { return (kGpuRowTile / 2) * (kGpuColChunk / group_size); }
/// Lanes that share one scale slot (the lanes t of row g inside one group): group_size / 16.
constexpr int64_t gpu_lanes_per_scale_slot(int64_t group_size) { return group_size / kGpuLaneCols; }

/// An NVFP4 / MXFP4 layer in the GPU layout above, on the host.
struct PackedFp4 {
  int64_t out_features = 0;  ///< N
  int64_t in_features = 0;   ///< K
  int64_t padded_rows = 0;   ///< Np
  int64_t padded_cols = 0;   ///< Kp
  quant::BlockFormat block_format = quant::BlockFormat::Nvfp4;  ///< the format of the scale bytes
  int64_t group_size = 0;    ///< the format's group size (its row in quant/block_format.h)
  std::vector<uint32_t> codes;  ///< [Np/16][Kp/64][32][4]
  std::vector<uint8_t> scales;  ///< [Np/16][Kp/64][S][2], S = scale_slots()

  int64_t row_tiles() const { return padded_rows / kGpuRowTile; }
  int64_t col_chunks() const { return padded_cols / kGpuColChunk; }
  int64_t scale_slots() const { return gpu_scale_slots(group_size); }
};

/// An FP4 layer's row blocks (quant::LinearWeights, checkpoint order), validated and indexed by output row, for the
/// host-side repacks (this layout, the native cuBLASLt operands, the global scales and biases).
class Fp4Rows {
 public:
  /// Throws UnsupportedError unless `w` is an FP4 (block-format) layer, FormatError for a malformed row block
  /// (quant::check_fp4_rows) or one whose K differs from w.in_features.
  explicit Fp4Rows(const quant::LinearWeights& w);
  quant::BlockFormat block_format() const { return format_; }
  int64_t out_features() const { return static_cast<int64_t>(codes_.size()); }
  int64_t in_features() const { return in_features_; }
  int64_t groups() const { return groups_; }
  /// The E2M1 code of (row, column), as stored.
  uint8_t nibble(int64_t row, int64_t col) const {
    const uint8_t b = codes_[static_cast<size_t>(row)][col / 2];
    return col % 2 == 0 ? static_cast<uint8_t>(b & 0x0F) : static_cast<uint8_t>(b >> 4);
  }
  /// The block-scale byte of (row, scale group), as stored.
  uint8_t scale_byte(int64_t row, int64_t group) const { return scales_[static_cast<size_t>(row)][group]; }
  /// The row's stored global scale (0 for formats without one).
  float global_scale(int64_t row) const { return global_[static_cast<size_t>(row)]; }

 private:
  quant::BlockFormat format_ = quant::BlockFormat::Nvfp4;
  int64_t in_features_ = 0, groups_ = 0;
  std::vector<const uint8_t*> codes_;   // per row: K/2 bytes
  std::vector<const uint8_t*> scales_;  // per row: K/g bytes
  std::vector<float> global_;
};

/// Repacks the codes and block-scale bytes of an FP4 layer (NVFP4, MXFP4) from checkpoint order (bytes unchanged,
/// positions moved). Global scale, bias and convention are not part of it (upload_linear copies them as stored).
/// Throws what Fp4Rows throws, and UnsupportedError for a block format whose group size the layout cannot hold
/// (gpu_layout_supports).
PackedFp4 pack_fp4_for_gpu(const quant::LinearWeights& w);
/// The same from rows already read and validated (upload_linear reads a layer once for all its repacks).
PackedFp4 pack_fp4_for_gpu(const Fp4Rows& rows);

}  // namespace fp4serve::kernels::cuda
