// SPDX-License-Identifier: Apache-2.0
#include "quant/dequant.h"

#include <fmt/format.h>

#include <cmath>
#include <span>

#include "fp4serve/error.h"
#include "quant/formats.h"
#include "quant/packing.h"

namespace fp4serve::quant {
namespace {

using core::DType;
using core::TensorView;

void expect_tensor(const TensorView& t, std::span<const DType> dtypes, const std::vector<int64_t>& shape,
                   std::string_view name, std::string_view role) {
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok = dtype_ok || d == t.dtype;
  if (!dtype_ok) {
    std::string allowed;
    for (DType d : dtypes) allowed += (allowed.empty() ? "" : " or ") + std::string(core::dtype_name(d));
    throw FormatError(fmt::format("{}.{}: dtype {} where {} was expected", name, role, core::dtype_name(t.dtype), allowed));
  }
  if (t.shape != shape) {
    throw FormatError(fmt::format("{}.{}: shape {} where {} was expected", name, role, core::shape_to_string(t.shape),
                                  core::shape_to_string(shape)));
  }
}
void expect_tensor(const TensorView& t, std::initializer_list<DType> dtypes, const std::vector<int64_t>& shape,
                   std::string_view name, std::string_view role) {
  expect_tensor(t, std::span<const DType>(dtypes.begin(), dtypes.size()), shape, name, role);
}

float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::BF16: return bf16_to_float(float_to_bf16(v));
    case DType::F16: return f16_to_float(float_to_f16(v));
    case DType::F32: return v;
    case DType::Bool: case DType::U8: case DType::I8: case DType::I16: case DType::U16: case DType::I32:
    case DType::U32: case DType::I64: case DType::U64: case DType::F64: case DType::F8_E4M3: case DType::F8_E5M2:
    case DType::F8_E8M0: case DType::F8_E4M3FNUZ: case DType::F8_E5M2FNUZ: case DType::F4: case DType::F6_E2M3:
    case DType::F6_E3M2: case DType::C64:
      break;
  }
  throw FormatError(fmt::format("cannot round to {}", core::dtype_name(dtype)));
}

int64_t dim(const TensorView& t, size_t i) { return i < t.shape.size() ? t.shape[i] : -1; }

}  // namespace

float load_float(const TensorView& t, size_t i, std::string_view name) {
  switch (t.dtype) {
    case DType::BF16: return bf16_to_float(t.load<uint16_t>(i));
    case DType::F16: return f16_to_float(t.load<uint16_t>(i));
    case DType::F32: return t.load<float>(i);
    case DType::Bool: case DType::U8: case DType::I8: case DType::I16: case DType::U16: case DType::I32:
    case DType::U32: case DType::I64: case DType::U64: case DType::F64: case DType::F8_E4M3: case DType::F8_E5M2:
    case DType::F8_E8M0: case DType::F8_E4M3FNUZ: case DType::F8_E5M2FNUZ: case DType::F4: case DType::F6_E2M3:
    case DType::F6_E3M2: case DType::C64:
      break;
  }
  throw FormatError(fmt::format("{}: dtype {} where BF16, F16 or F32 was expected", name, core::dtype_name(t.dtype)));
}

DequantizedWeight dequantize_block(BlockFormat format, const TensorView& weight_packed, const TensorView& weight_scale,
                                   float global_scale, GlobalScaleConvention convention, std::string_view name) {
  const BlockFormatTraits& f = block_format_traits(format);
  if (weight_packed.shape.size() != 2) {
    throw FormatError(fmt::format("{}.weight_packed: shape {} where [N, K/2] was expected", name,
                                  core::shape_to_string(weight_packed.shape)));
  }
  const int64_t n = dim(weight_packed, 0);
  const int64_t k = 2 * dim(weight_packed, 1);
  const int64_t g = f.group_size;
  expect_tensor(weight_packed, {DType::U8}, {n, k / 2}, name, "weight_packed");
  if (k % g != 0) {
    throw FormatError(fmt::format("{}: K = {} is not a multiple of the {} group size {}", name, k, f.name, g));
  }
  expect_tensor(weight_scale, f.scale_dtypes, {n, k / g}, name, "weight_scale");
  if (f.global_scale && (!std::isfinite(global_scale) || global_scale == 0.0f)) {
    throw FormatError(fmt::format("{}: global scale {} must be finite and non-zero", name, global_scale));
  }
  DequantizedWeight out{DType::BF16, n, k, std::vector<float>(static_cast<size_t>(n * k))};
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t group = 0; group < k / g; ++group) {
      const float s = decode_block_scale(format, weight_scale.load<uint8_t>(static_cast<size_t>(r * (k / g) + group)));
      // The block scale and the global scale are combined in fp32 before the element, as both references do;
      // MXFP4's BF16 scale times an E2M1 value is exact, so its product needs no such order.
      const float t = !f.global_scale                                 ? s
                      : convention == GlobalScaleConvention::Divisor ? s / global_scale
                                                                     : s * global_scale;
      for (int64_t j = 0; j < g; ++j) {
        const int64_t col = group * g + j;
        const uint8_t byte = weight_packed.load<uint8_t>(static_cast<size_t>(r * (k / 2) + col / 2));
        float q = e2m1_to_float(col % 2 == 0 ? fp4_even(byte) : fp4_odd(byte));
        // ModelOpt's decoder yields +0 for the code −0 (0x8); compressed-tensors keeps −0. Values are equal;
        // the bits follow each producer's reference.
        if (f.global_scale && convention == GlobalScaleConvention::Multiplier && q == 0.0f) q = 0.0f;
        out.values[static_cast<size_t>(r * k + col)] = round_to(DType::BF16, q * t);
      }
    }
  }
  return out;
}

DequantizedWeight dequantize_int4(const TensorView& weight_packed, const TensorView& weight_scale,
                                  const TensorView* zero_point, const TensorView* g_idx, int64_t in_features,
                                  int64_t group_size, std::string_view name) {
  const int64_t n = dim(weight_packed, 0);
  const int64_t k = in_features;
  expect_tensor(weight_packed, {DType::I32}, {n, (k + 7) / 8}, name, "weight_packed");
  const bool channel = group_size <= 0;
  const int64_t groups = channel ? 1 : (k + group_size - 1) / group_size;
  const bool tensor_scale = weight_scale.numel() == 1 && n != 1;
  if (!tensor_scale) {
    expect_tensor(weight_scale, {DType::BF16, DType::F16, DType::F32}, {n, groups}, name, "weight_scale");
  }
  if (zero_point != nullptr) {
    expect_tensor(*zero_point, {DType::I32}, {(n + 7) / 8, groups}, name, "weight_zero_point");
  }
  if (g_idx != nullptr) expect_tensor(*g_idx, {DType::I32}, {k}, name, "weight_g_idx");
  const DType out_dtype = weight_scale.dtype;
  DequantizedWeight out{out_dtype, n, k, std::vector<float>(static_cast<size_t>(n * k))};
  const auto words_per_row = static_cast<size_t>((k + 7) / 8);
  std::vector<int32_t> row_words(words_per_row);
  std::vector<int32_t> zp_words;
  if (zero_point != nullptr) {
    zp_words.resize(static_cast<size_t>(zero_point->numel()));
    for (size_t i = 0; i < zp_words.size(); ++i) zp_words[i] = zero_point->load<int32_t>(i);
  }
  for (int64_t r = 0; r < n; ++r) {
    for (size_t w = 0; w < words_per_row; ++w) row_words[w] = weight_packed.load<int32_t>(static_cast<size_t>(r) * words_per_row + w);
    for (int64_t col = 0; col < k; ++col) {
      int64_t group = channel ? 0 : col / group_size;
      if (g_idx != nullptr) {
        group = g_idx->load<int32_t>(static_cast<size_t>(col));
        if (group < 0 || group >= groups) {
          throw FormatError(fmt::format("{}.weight_g_idx[{}] = {} is outside [0, {})", name, col, group, groups));
        }
      }
      const int q = unpack_int4(row_words, static_cast<size_t>(col));
      const int z = zero_point == nullptr ? 0
                                          : unpack_int4_along_rows(zp_words, static_cast<size_t>(groups),
                                                                   static_cast<size_t>(r), static_cast<size_t>(group));
      const float scale = load_float(weight_scale, tensor_scale ? 0 : static_cast<size_t>(r * groups + group), name);
      out.values[static_cast<size_t>(r * k + col)] = round_to(out_dtype, static_cast<float>(q - z) * scale);
    }
  }
  return out;
}

DequantizedWeight dequantize_fp8(const TensorView& weight, const TensorView& weight_scale, int64_t block_rows,
                                 int64_t block_cols, std::string_view name) {
  if (weight.shape.size() != 2) {
    throw FormatError(fmt::format("{}.weight: shape {} where [N, K] was expected", name,
                                  core::shape_to_string(weight.shape)));
  }
  const int64_t n = weight.shape[0];
  const int64_t k = weight.shape[1];
  expect_tensor(weight, {DType::F8_E4M3}, {n, k}, name, "weight");
  const int64_t count = weight_scale.numel();
  const bool block = block_rows > 0 && block_cols > 0;
  const int64_t brows = block ? (n + block_rows - 1) / block_rows : 0;
  const int64_t bcols = block ? (k + block_cols - 1) / block_cols : 0;
  if (block) {
    expect_tensor(weight_scale, {DType::BF16, DType::F16, DType::F32}, {brows, bcols}, name, "weight_scale");
  } else if (count != 1 && count != n) {
    throw FormatError(fmt::format("{}.weight_scale: shape {} fits neither a tensor scale [1] nor a channel scale [{}, 1]",
                                  name, core::shape_to_string(weight_scale.shape), n));
  }
  DequantizedWeight out{weight_scale.dtype, n, k, std::vector<float>(static_cast<size_t>(n * k))};
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      size_t si = 0;
      if (block) si = static_cast<size_t>((r / block_rows) * bcols + c / block_cols);
      else if (count == n) si = static_cast<size_t>(r);
      const float s = load_float(weight_scale, si, name);
      const float v = e4m3_to_float(weight.load<uint8_t>(static_cast<size_t>(r * k + c)));
      out.values[static_cast<size_t>(r * k + c)] = round_to(out.dtype, v * s);
    }
  }
  return out;
}

}  // namespace fp4serve::quant
