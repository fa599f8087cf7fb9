// SPDX-License-Identifier: Apache-2.0
#include "quant/slice.h"

#include <fmt/format.h>

#include <cstring>

#include "core/dtype.h"
#include "fp4serve/error.h"

namespace fp4serve::quant {
namespace {

size_t element_bytes(const core::TensorView& t, std::string_view name) {
  const int64_t numel = t.numel();
  if (numel <= 0 || t.bytes.size() % static_cast<size_t>(numel) != 0) {
    throw FormatError(fmt::format("{}: cannot slice a tensor of shape {} stored in {} bytes (sub-byte elements)",
                                  name, core::shape_to_string(t.shape), t.bytes.size()));
  }
  return t.bytes.size() / static_cast<size_t>(numel);
}

OwnedTensor own(core::DType dtype, std::vector<int64_t> shape, std::vector<std::byte> bytes) {
  OwnedTensor out;
  out.bytes = std::move(bytes);
  out.view = core::TensorView{dtype, std::move(shape), std::span<const std::byte>(out.bytes)};
  return out;
}

}  // namespace

OwnedTensor slice_rows(const core::TensorView& t, int64_t begin, int64_t end, std::string_view name) {
  if (t.shape.empty() || begin < 0 || end < begin || end > t.shape[0]) {
    throw FormatError(fmt::format("{}: rows [{}, {}) of a tensor shaped {}", name, begin, end,
                                  core::shape_to_string(t.shape)));
  }
  const size_t elem = element_bytes(t, name);
  const auto row = static_cast<size_t>(t.numel() / t.shape[0]) * elem;
  std::vector<int64_t> shape = t.shape;
  shape[0] = end - begin;
  const std::byte* src = t.bytes.data() + static_cast<size_t>(begin) * row;
  return own(t.dtype, std::move(shape), std::vector<std::byte>(src, src + static_cast<size_t>(end - begin) * row));
}

OwnedTensor slice_columns(const core::TensorView& t, int64_t begin, int64_t end, std::string_view name) {
  if (t.shape.size() != 2 || begin < 0 || end < begin || end > t.shape[1]) {
    throw FormatError(fmt::format("{}: columns [{}, {}) of a tensor shaped {} (expected 2-D)", name, begin, end,
                                  core::shape_to_string(t.shape)));
  }
  const size_t elem = element_bytes(t, name);
  const int64_t rows = t.shape[0], cols = t.shape[1], width = end - begin;
  std::vector<std::byte> bytes(static_cast<size_t>(rows * width) * elem);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(bytes.data() + static_cast<size_t>(r * width) * elem,
                t.bytes.data() + static_cast<size_t>(r * cols + begin) * elem, static_cast<size_t>(width) * elem);
  }
  return own(t.dtype, {rows, width}, std::move(bytes));
}

OwnedTensor slice_packed_int4_rows(const core::TensorView& t, int64_t begin, int64_t end, std::string_view name) {
  if (t.dtype != core::DType::I32 || t.shape.size() != 2 || begin < 0 || end < begin || end > 8 * t.shape[0]) {
    throw FormatError(fmt::format("{}: packed int4 rows [{}, {}) of a {} tensor shaped {} (expected I32 [ceil(N/8), G])",
                                  name, begin, end, core::dtype_name(t.dtype), core::shape_to_string(t.shape)));
  }
  const int64_t cols = t.shape[1], words = (end - begin + 7) / 8;
  std::vector<uint32_t> out(static_cast<size_t>(words * cols), 0u);
  for (int64_t r = begin; r < end; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const auto word = static_cast<uint32_t>(t.load<int32_t>(static_cast<size_t>((r / 8) * cols + c)));
      const uint32_t nibble = (word >> (4 * (r % 8))) & 0xFu;
      const int64_t d = r - begin;
      out[static_cast<size_t>((d / 8) * cols + c)] |= nibble << (4 * (d % 8));
    }
  }
  std::vector<std::byte> bytes(out.size() * sizeof(uint32_t));
  std::memcpy(bytes.data(), out.data(), bytes.size());
  return own(core::DType::I32, {words, cols}, std::move(bytes));
}

}  // namespace fp4serve::quant
