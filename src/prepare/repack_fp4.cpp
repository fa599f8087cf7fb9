// SPDX-License-Identifier: Apache-2.0
// Block-format (NVFP4, MXFP4) checkpoint tensors → the row-interleaved FP4 kernel layout (prepared_linear.h).
#include <cmath>
#include <cstring>
#include <span>

#include "prepare/repack.h"
#include "prepare/repack_util.h"

namespace fp4serve::prepare {
namespace {

using detail::fail;

// Shared shape logic: returns K after checking weight_packed [N, K/2] U8 and weight_scale [N, K/group].
int64_t check_fp4_shapes(const core::TensorView& packed, const core::TensorView& scale, int64_t group,
                         std::span<const core::DType> scale_dtypes, std::string_view name) {
  detail::check_dtype(packed, {core::DType::U8}, name, "packed FP4 weight");
  if (packed.shape.size() != 2 || packed.shape[0] == 0 || packed.shape[1] == 0) {
    fail(name, "packed FP4 weight",
         fmt::format("has shape {}, expected [N, K/2] with N, K > 0", core::shape_to_string(packed.shape)));
  }
  const int64_t n = packed.shape[0];
  const int64_t k = packed.shape[1] * 2;
  if (k % group != 0) {
    fail(name, "packed FP4 weight",
         fmt::format("has K = {} (shape {}), which is not a multiple of the scale group size {}", k,
                     core::shape_to_string(packed.shape), group));
  }
  detail::check_dtype(scale, scale_dtypes, name, "block scale");
  detail::check_shape(scale, {n, k / group}, name, "block scale");
  return k;
}

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
  const int64_t k = check_fp4_shapes(weight_packed, weight_scale, g, f.scale_dtypes, name);
  if (f.global_scale && (!std::isfinite(global_scale) || global_scale <= 0.f)) {
    const char* role = convention == GlobalScaleConvention::Divisor ? "weight_global_scale" : "weight_scale_2";
    fail(name, role, fmt::format("is {}, expected a finite value > 0", global_scale));
  }
  // E4M3 has NaN codes (0x7F/0xFF), which no reference produces; E8M0's 255 decodes to +inf as in the references.
  const auto* scale_bytes = reinterpret_cast<const uint8_t*>(weight_scale.bytes.data());
  if (f.scale == quant::ElementFormat::E4M3) {
    for (size_t i = 0; i < weight_scale.bytes.size(); ++i) {
      if ((scale_bytes[i] & 0x7F) == 0x7F) {
        fail(name, "block scale",
             fmt::format("[{}, {}] is NaN (E4M3 byte 0x{:02X})", static_cast<int64_t>(i) / (k / g),
                         static_cast<int64_t>(i) % (k / g), scale_bytes[i]));
      }
    }
  }
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
