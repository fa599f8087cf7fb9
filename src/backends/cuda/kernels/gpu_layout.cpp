// SPDX-License-Identifier: Apache-2.0
#include "backends/cuda/kernels/gpu_layout.h"

#include <string>

#include "fp4serve/error.h"

namespace fp4serve::kernels::cuda {

namespace {

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

}  // namespace

Fp4Rows::Fp4Rows(const quant::LinearWeights& w) {
  if (w.encoding != quant::WeightEncoding::Fp4) {
    throw UnsupportedError(std::string("CUDA FP4 GEMM: a ") + quant::weight_encoding_name(w.encoding) +
                           " layer is not an FP4 block format (NVFP4, MXFP4)");
  }
  const quant::BlockFormatTraits& f = quant::block_format_traits(w.block_format);
  format_ = w.block_format;
  in_features_ = w.in_features;
  groups_ = w.in_features / f.group_size;
  for (const quant::WeightRows& r : w.rows) {
    const int64_t k = quant::check_fp4_rows(w.block_format, r.weight, r.weight_scale, r.global_scale, w.convention, r.name);
    if (k != w.in_features) {
      quant::fail_tensor(r.name, "packed FP4 weight",
                         "has K = " + std::to_string(k) + ", the layer " + std::to_string(w.in_features));
    }
    const auto* codes = reinterpret_cast<const uint8_t*>(r.weight.bytes.data());
    const auto* scales = reinterpret_cast<const uint8_t*>(r.weight_scale.bytes.data());
    for (int64_t row = 0; row < r.out_features(); ++row) {
      codes_.push_back(codes + row * (k / 2));
      scales_.push_back(scales + row * groups_);
      global_.push_back(f.global_scale ? r.global_scale : 0.f);
    }
  }
  if (codes_.empty()) throw UsageError("CUDA FP4 GEMM: a layer with no rows");
}

PackedFp4 pack_fp4_for_gpu(const quant::LinearWeights& w) { return pack_fp4_for_gpu(Fp4Rows(w)); }

PackedFp4 pack_fp4_for_gpu(const Fp4Rows& rows) {
  const quant::BlockFormat format = rows.block_format();
  const int64_t group_size = quant::block_format_traits(format).group_size;
  if (!gpu_layout_supports(group_size)) {
    throw UnsupportedError("CUDA FP4 GEMM: " + std::string(quant::block_format_name(format)) + " groups of " +
                           std::to_string(group_size) + " columns do not fit the GPU layout (a multiple of " +
                           std::to_string(kGpuLaneCols) + " dividing " + std::to_string(kGpuColChunk) + ")");
  }
  const int64_t n = rows.out_features(), k = rows.in_features();
  PackedFp4 p;
  p.out_features = n;
  p.in_features = k;
  p.padded_rows = round_up(n, kGpuRowTile);
  p.padded_cols = round_up(k, kGpuColChunk);
  p.block_format = format;
  p.group_size = group_size;
  const int64_t tiles = p.row_tiles(), chunks = p.col_chunks(), slots = p.scale_slots();
  const int64_t groups_per_chunk = kGpuColChunk / group_size;
  p.codes.assign(static_cast<size_t>(tiles * chunks * 32 * 4), 0u);
  p.scales.assign(static_cast<size_t>(tiles * chunks * slots * 2), uint8_t{0});
  for (int64_t rt = 0; rt < tiles; ++rt) {
    for (int64_t c = 0; c < chunks; ++c) {
      for (int64_t lane = 0; lane < 32; ++lane) {
        const int64_t g = lane / 4, t = lane % 4;
        for (int64_t j = 0; j < 4; ++j) {
          uint32_t word = 0;
          for (int64_t i = 0; i < 8; ++i) {
            const int64_t row = kGpuRowTile * rt + g + 8 * (i & 1);
            const int64_t col = kGpuColChunk * c + 16 * t + 4 * j + (i >> 2) + 2 * ((i >> 1) & 1);
            if (row < n && col < k) word |= static_cast<uint32_t>(rows.nibble(row, col)) << (4 * i);
          }
          p.codes[static_cast<size_t>(((rt * chunks + c) * 32 + lane) * 4 + j)] = word;
        }
      }
      for (int64_t slot = 0; slot < slots; ++slot) {
        const int64_t g = slot / groups_per_chunk;
        const int64_t group = groups_per_chunk * c + slot % groups_per_chunk;
        for (int64_t half = 0; half < 2; ++half) {
          const int64_t row = kGpuRowTile * rt + g + 8 * half;
          if (row < n && group < rows.groups()) {
            p.scales[static_cast<size_t>(((rt * chunks + c) * slots + slot) * 2 + half)] = rows.scale_byte(row, group);
          }
        }
      }
    }
  }
  return p;
}

}  // namespace fp4serve::kernels::cuda
