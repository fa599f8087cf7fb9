// SPDX-License-Identifier: Apache-2.0
// compressed-tensors int4 pack-quantized tensors → the row-interleaved int4 kernel layout (prepared_linear.h).
#include <algorithm>
#include <numeric>

#include "backends/cpu/prepare/repack.h"
#include "backends/cpu/prepare/repack_util.h"
#include "quant/dequant.h"

namespace fp4serve::prepare {
namespace {

using detail::fail;

// Column order of the prepared layout: input columns sorted by group (stable), so each group is contiguous.
// Returns an empty vector when g_idx is the identity grouping k / group_size.
std::vector<int32_t> activation_order(const core::TensorView& g_idx, int64_t k, int64_t group, int64_t groups,
                                      std::string_view name) {
  detail::check_dtype(g_idx, {core::DType::I32}, name, "g_idx");
  detail::check_shape(g_idx, {k}, name, "g_idx");
  std::vector<int32_t> gi(static_cast<size_t>(k));
  bool identity = true;
  for (int64_t i = 0; i < k; ++i) {
    gi[static_cast<size_t>(i)] = g_idx.load<int32_t>(static_cast<size_t>(i));
    if (gi[static_cast<size_t>(i)] < 0 || gi[static_cast<size_t>(i)] >= groups) {
      fail(name, "g_idx", fmt::format("[{}] = {} is outside [0, {})", i, gi[static_cast<size_t>(i)], groups));
    }
    identity = identity && gi[static_cast<size_t>(i)] == i / group;
  }
  if (identity) return {};
  std::vector<int32_t> perm(static_cast<size_t>(k));
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int32_t a, int32_t b) { return gi[static_cast<size_t>(a)] < gi[static_cast<size_t>(b)]; });
  for (int64_t j = 0; j < k; ++j) {
    if (gi[static_cast<size_t>(perm[static_cast<size_t>(j)])] != j / group) {
      throw UnsupportedError(fmt::format(
          "{}: g_idx does not give every group exactly {} columns (sorted position {} holds group {}, expected {}); "
          "only balanced activation orders are supported",
          name, group, j, gi[static_cast<size_t>(perm[static_cast<size_t>(j)])], j / group));
    }
  }
  return perm;
}

}  // namespace

PreparedLinear prepare_int4(const core::TensorView& weight_packed, const core::TensorView& weight_scale,
                            const core::TensorView* zero_point, const core::TensorView* g_idx, int64_t in_features,
                            int64_t group_size, std::string_view name) {
  detail::check_dtype(weight_packed, {core::DType::I32}, name, "weight_packed");
  if (in_features <= 0) fail(name, "in_features", fmt::format("is {}, expected > 0", in_features));
  if (weight_packed.shape.size() != 2 || weight_packed.shape[0] == 0) {
    fail(name, "weight_packed",
         fmt::format("has shape {}, expected [N, ceil(K/8)] with N > 0", core::shape_to_string(weight_packed.shape)));
  }
  const int64_t n = weight_packed.shape[0];
  const int64_t k = in_features;
  detail::check_shape(weight_packed, {n, (k + 7) / 8}, name, "weight_packed");
  if (group_size == 0 || group_size < -1) {
    fail(name, "group_size", fmt::format("is {}, expected -1 (channel) or > 0", group_size));
  }
  const int64_t group = group_size == -1 ? k : group_size;
  const int64_t groups = (k + group - 1) / group;
  if (k % 8 != 0 || group % 8 != 0) {
    throw UnsupportedError(fmt::format(
        "{}: int4 kernels need K ({}) and the group size ({}) to be multiples of 8", name, k, group));
  }
  detail::check_dtype(weight_scale, {core::DType::BF16, core::DType::F16, core::DType::F32}, name, "weight_scale");
  detail::check_shape(weight_scale, {n, groups}, name, "weight_scale");
  if (zero_point != nullptr) {
    detail::check_dtype(*zero_point, {core::DType::I32}, name, "weight_zero_point");
    detail::check_shape(*zero_point, {(n + 7) / 8, groups}, name, "weight_zero_point");
  }
  std::vector<int32_t> perm;
  if (g_idx != nullptr) perm = activation_order(*g_idx, k, group, groups, name);

  PreparedLinear w;
  detail::init_tiles(w, WeightLayout::Int4, n, k, group, static_cast<size_t>(k / 2) * kTileRows,
                     static_cast<size_t>(groups) * kTileRows * sizeof(float),
                     static_cast<size_t>(groups) * kTileRows * sizeof(float));
  w.k_perm = perm;
  const int64_t words = (k + 7) / 8;
  auto* codes = w.codes.as<uint8_t>();
  auto* scales = w.scales.as<float>();
  auto* offsets = w.offsets.as<float>();
  for (int64_t row = 0; row < n; ++row) {
    const int64_t t = row / kTileRows, r = row % kTileRows;
    auto nibble_at = [&](int64_t col) {
      const auto word = static_cast<uint32_t>(weight_packed.load<int32_t>(static_cast<size_t>(row * words + col / 8)));
      return static_cast<uint8_t>((word >> (4 * (col % 8))) & 0xF);
    };
    for (int64_t c = 0; c < k / 8; ++c) {
      uint8_t nib[8];
      for (int64_t j = 0; j < 8; ++j) {
        const int64_t col = perm.empty() ? 8 * c + j : perm[static_cast<size_t>(8 * c + j)];
        nib[j] = nibble_at(col);
      }
      detail::put_octet(codes + code_tile_offset(k, t) + c * kOctetStride, r, nib);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const float s = quant::load_float(weight_scale, static_cast<size_t>(row * groups + g), name);
      int z = 0;
      if (zero_point != nullptr) {
        const auto word = static_cast<uint32_t>(zero_point->load<int32_t>(static_cast<size_t>((row / 8) * groups + g)));
        z = static_cast<int>((word >> (4 * (row % 8))) & 0xF) - 8;
      }
      const size_t at = static_cast<size_t>((t * groups + g) * kTileRows + r);
      scales[at] = s;
      // nibble·s + offset = (q − z)·s exactly: both products are exact (≤ 5-bit integer × ≤ 24-bit scale fits
      // only when s is bf16/f16; for f32 scales each term rounds once, which the tests allow for).
      offsets[at] = -static_cast<float>(8 + z) * s;
    }
  }
  return w;
}

}  // namespace fp4serve::prepare
