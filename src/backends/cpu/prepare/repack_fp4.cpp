// SPDX-License-Identifier: Apache-2.0
// Block-format (NVFP4, MXFP4) checkpoint tensors → the row-interleaved FP4 kernel layout (prepared_linear.h).
#include <cmath>
#include <cstring>
#include <span>

#include "backends/cpu/prepare/repack.h"
#include "backends/cpu/prepare/repack_util.h"

namespace fp4serve::prepare {
namespace {

// Interleaves the codes of [N, K/2] bytes into tile pairs [T/2][K/8][2][32] (prepared_linear.h).
void interleave_fp4(const core::TensorView& packed, PreparedLinear& w) {
  const int64_t n = w.out_features;
  const int64_t octets = w.in_features / 8;
  const auto* src = reinterpret_cast<const uint8_t*>(packed.bytes.data());
  auto* dst = w.codes.as<uint8_t>();
  for (int64_t row = 0; row < n; ++row) {
    const uint8_t* s = src + row * (w.in_features / 2);
    uint8_t* tile = dst + code_tile_offset(w.in_features, row / kTileRows);
    const int64_t r = row % kTileRows;
    for (int64_t c = 0; c < octets; ++c) {
      const uint8_t* b = s + 4 * c;  // 4 bytes = columns 8c..8c+7, even column in the low nibble
      const uint8_t nib[8] = {static_cast<uint8_t>(b[0] & 0xF), static_cast<uint8_t>(b[0] >> 4),
                              static_cast<uint8_t>(b[1] & 0xF), static_cast<uint8_t>(b[1] >> 4),
                              static_cast<uint8_t>(b[2] & 0xF), static_cast<uint8_t>(b[2] >> 4),
                              static_cast<uint8_t>(b[3] & 0xF), static_cast<uint8_t>(b[3] >> 4)};
      detail::put_octet(tile + c * kOctetStride, r, nib);
    }
  }
}

// Copies [N, G] scale bytes into tile pairs [T/2][G][2][8].
void interleave_scale_bytes(const core::TensorView& scale, PreparedLinear& w) {
  const int64_t g = w.groups();
  const auto* src = reinterpret_cast<const uint8_t*>(scale.bytes.data());
  auto* dst = w.scales.as<uint8_t>();
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
