// SPDX-License-Identifier: Apache-2.0
// Bias, activation global scale, and row concatenation of prepared layers (fused q/k/v, gate/up).
#include <cmath>
#include <cstring>

#include "backends/cpu/prepare/repack.h"
#include "backends/cpu/prepare/repack_util.h"
#include "quant/dequant.h"

namespace fp4serve::prepare {

void attach_bias(PreparedLinear& w, const core::TensorView& bias, std::string_view name) {
  detail::check_dtype(bias, {core::DType::BF16, core::DType::F16, core::DType::F32}, name, "bias");
  detail::check_shape(bias, {w.out_features}, name, "bias");
  w.bias.resize(static_cast<size_t>(w.out_features));
  for (size_t i = 0; i < w.bias.size(); ++i) w.bias[i] = quant::load_float(bias, i, name);
}

void set_input_global_scale(PreparedLinear& w, float value, GlobalScaleConvention convention) {
  w.input_global_scale = quant::input_global_scale_divisor(value, convention);
}

PreparedLinear concat_rows(std::vector<PreparedLinear> parts) {
  if (parts.empty()) throw UsageError("concat_rows: no parts");
  if (parts.size() == 1) return std::move(parts[0]);
  const PreparedLinear& first = parts[0];
  bool any_bias = false;
  int64_t n = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const PreparedLinear& p = parts[i];
    if (p.layout != first.layout || p.block_format != first.block_format || p.in_features != first.in_features || p.group_size != first.group_size ||
        p.dense_storage != first.dense_storage || p.convention != first.convention || p.k_perm != first.k_perm ||
        p.activation_precision != first.activation_precision) {
      throw UsageError(fmt::format(
          "concat_rows: part {} ({}, K = {}, group {}) does not match part 0 ({}, K = {}, group {}) in layout, format, K, "
          "group size, storage, global-scale convention, activation order or activation precision",
          i, format_label(p), p.in_features, p.group_size, format_label(first), first.in_features,
          first.group_size));
    }
    if (p.input_global_scale != first.input_global_scale) {
      throw FormatError(fmt::format("concat_rows: part {} has input_global_scale {} but part 0 has {}; fused layers "
                                    "quantize one activation and must share it",
                                    i, p.input_global_scale, first.input_global_scale));
    }
    if (i + 1 < parts.size() && p.out_features % kTileRows != 0) {
      throw UnsupportedError(fmt::format("concat_rows: part {} has {} rows, not a multiple of {}", i, p.out_features,
                                         kTileRows));
    }
    any_bias = any_bias || !p.bias.empty();
    n += p.out_features;
  }
  PreparedLinear out;
  const auto per_tile = [&](const AlignedBuffer& b, const PreparedLinear& p) { return b.size() / static_cast<size_t>(p.tiles()); };
  const size_t code_tile = per_tile(first.codes, first);
  const size_t scale_tile = per_tile(first.scales, first);
  const size_t offset_tile = per_tile(first.offsets, first);
  detail::init_tiles(out, first.layout, n, first.in_features, first.group_size, code_tile, scale_tile, offset_tile);
  // Tile pairs (prepared_linear.h): a part may end on the first tile of a pair, so its tiles move one at a time,
  // in chunks (column octets of the codes, groups of the Fp4 scale bytes); other buffers hold each tile contiguously.
  const bool paired = first.layout == WeightLayout::Fp4 || first.layout == WeightLayout::Int4;
  const int64_t octets = first.in_features / 8, groups = first.groups();
  const auto copy_tile = [&](const PreparedLinear& p, int64_t from, int64_t to) {
    for (int64_t c = 0; c < octets; ++c) {
      std::memcpy(out.codes.as<uint8_t>() + code_tile_offset(p.in_features, to) + c * kOctetStride,
                  p.codes.as<uint8_t>() + code_tile_offset(p.in_features, from) + c * kOctetStride, 32);
    }
    if (first.layout == WeightLayout::Fp4) {
      for (int64_t g = 0; g < groups; ++g) {
        std::memcpy(out.scales.as<uint8_t>() + scale_tile_offset(groups, to) + g * kScaleGroupStride,
                    p.scales.as<uint8_t>() + scale_tile_offset(groups, from) + g * kScaleGroupStride, kTileRows);
      }
    } else if (scale_tile > 0) {
      std::memcpy(out.scales.data() + static_cast<size_t>(to) * scale_tile, p.scales.data() + static_cast<size_t>(from) * scale_tile, scale_tile);
    }
    if (offset_tile > 0) {
      std::memcpy(out.offsets.data() + static_cast<size_t>(to) * offset_tile, p.offsets.data() + static_cast<size_t>(from) * offset_tile, offset_tile);
    }
  };
  out.dense_storage = first.dense_storage;
  out.block_format = first.block_format;
  out.convention = first.convention;
  out.activation_precision = first.activation_precision;
  out.k_perm = first.k_perm;
  out.input_global_scale = first.input_global_scale;
  if (!first.global_scale.empty()) out.global_scale.assign(static_cast<size_t>(out.padded_rows), 1.f);
  if (any_bias) out.bias.assign(static_cast<size_t>(n), 0.f);
  int64_t row0 = 0;
  for (const PreparedLinear& p : parts) {
    const int64_t t0 = row0 / kTileRows;
    if (paired) {
      const int64_t tiles = (p.out_features + kTileRows - 1) / kTileRows;  // without a pair's zero padding tile
#pragma omp parallel for schedule(static) if (tiles * octets >= (1 << 12))
      for (int64_t t = 0; t < tiles; ++t) copy_tile(p, t, t0 + t);
    } else {
      const auto tiles = static_cast<size_t>(p.tiles());
      const auto at = static_cast<size_t>(t0);
      std::memcpy(out.codes.data() + at * code_tile, p.codes.data(), tiles * code_tile);
      if (scale_tile > 0) std::memcpy(out.scales.data() + at * scale_tile, p.scales.data(), tiles * scale_tile);
      if (offset_tile > 0) std::memcpy(out.offsets.data() + at * offset_tile, p.offsets.data(), tiles * offset_tile);
    }
    for (int64_t r = 0; r < p.out_features; ++r) {
      const auto dst = static_cast<size_t>(row0 + r);
      if (!p.global_scale.empty()) out.global_scale[dst] = p.global_scale[static_cast<size_t>(r)];
      if (!p.bias.empty()) out.bias[dst] = p.bias[static_cast<size_t>(r)];
    }
    row0 += p.out_features;
  }
  return out;
}

}  // namespace fp4serve::prepare
