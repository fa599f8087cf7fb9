// SPDX-License-Identifier: Apache-2.0
// Block-format (NVFP4, MXFP4) checkpoint tensors → the row-interleaved FP4 kernel layout (prepared_linear.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "backends/cpu/prepare/repack.h"
#include "backends/cpu/prepare/repack_util.h"

namespace fp4serve::prepare {
namespace {

// Interleaves the codes of [N, K/2] bytes into tile pairs [T/2][K/8][2][32] (prepared_linear.h): tile by tile in
// parallel on the engine's threads, each tile's octets written in order while its 8 rows are read in order.
void interleave_fp4(const core::TensorView& packed, PreparedLinear& w) {
  const int64_t n = w.out_features;
  const int64_t octets = w.in_features / 8;
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  const auto* src = reinterpret_cast<const uint8_t*>(packed.bytes.data());
  auto* dst = w.codes.as<uint8_t>();
#pragma omp parallel for schedule(static) if (n * octets >= (1 << 14))
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t rows = std::min(kTileRows, n - t * kTileRows);  // padded rows stay zero
    uint8_t* tile = dst + code_tile_offset(w.in_features, t);
    for (int64_t c = 0; c < octets; ++c) {
      for (int64_t r = 0; r < rows; ++r) {
        // 4 bytes = columns 8c..8c+7 of row 8t + r, even column in the low nibble: the checkpoint's bytes unchanged.
        std::memcpy(tile + c * kOctetStride + 4 * r, src + (t * kTileRows + r) * (w.in_features / 2) + 4 * c, 4);
      }
    }
  }
}

// Copies [N, G] scale bytes into tile pairs [T/2][G][2][8].
void interleave_scale_bytes(const core::TensorView& scale, PreparedLinear& w) {
  const int64_t g = w.groups();
  const auto* src = reinterpret_cast<const uint8_t*>(scale.bytes.data());
  auto* dst = w.scales.as<uint8_t>();
#pragma omp parallel for schedule(static) if (w.out_features * g >= (1 << 14))
  for (int64_t row = 0; row < w.out_features; ++row) {
    uint8_t* tile = dst + scale_tile_offset(g, row / kTileRows);
    for (int64_t j = 0; j < g; ++j) tile[j * kScaleGroupStride + row % kTileRows] = src[row * g + j];
  }
}

}  // namespace

PreparedLinear prepare_fp4(quant::BlockFormat format, const core::TensorView& weight_packed,
                           const core::TensorView& weight_scale, float global_scale, GlobalScaleConvention convention,
                           std::string_view name) {
  const quant::BlockFormatTraits& f = quant::block_format_traits(format);
  const int64_t g = f.group_size;
  const int64_t k = quant::check_fp4_rows(format, weight_packed, weight_scale, global_scale, convention, name);
  PreparedLinear w;
  detail::init_tiles(w, WeightLayout::Fp4, weight_packed.shape[0], k, g, static_cast<size_t>(k / 2) * kTileRows,
                     static_cast<size_t>(k / g) * kTileRows, 0);
  w.block_format = format;
  interleave_fp4(weight_packed, w);
  interleave_scale_bytes(weight_scale, w);
  if (f.global_scale) {
    w.convention = convention;
    w.global_scale.assign(static_cast<size_t>(w.padded_rows), 1.f);
    for (int64_t row = 0; row < w.out_features; ++row) w.global_scale[static_cast<size_t>(row)] = global_scale;
  }
  return w;
}

}  // namespace fp4serve::prepare
