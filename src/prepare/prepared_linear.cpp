// SPDX-License-Identifier: Apache-2.0
#include "prepare/prepared_linear.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "prepare/repack_util.h"
#include "quant/formats.h"

namespace fp4serve::prepare {

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + 63) / 64 * 64;  // aligned_alloc requires a multiple of the alignment
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  data_.reset(p);
}

AlignedBuffer::AlignedBuffer(const AlignedBuffer& other) : AlignedBuffer(other.size_) {
  if (size_ > 0) std::memcpy(data_.get(), other.data_.get(), size_);
}

AlignedBuffer& AlignedBuffer::operator=(const AlignedBuffer& other) {
  if (this != &other) *this = AlignedBuffer(other);
  return *this;
}

void AlignedBuffer::Free::operator()(std::byte* p) const { std::free(p); }

size_t weight_bytes(const PreparedLinear& w) {
  return w.codes.size() + w.scales.size() + w.offsets.size() + w.global_scale.size() * sizeof(float);
}

const char* layout_name(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::Fp4: return "Fp4";
    case WeightLayout::Int4: return "Int4";
    case WeightLayout::Fp8: return "Fp8";
    case WeightLayout::Int8: return "Int8";
    case WeightLayout::Dense: return "Dense";
  }
  return "?";
}

std::string_view format_label(const PreparedLinear& w) {
  return w.layout == WeightLayout::Fp4 ? quant::block_format_name(w.block_format) : layout_name(w.layout);
}

namespace detail {

void fail(std::string_view name, std::string_view role, const std::string& message) {
  throw FormatError(fmt::format("{}: {} {}", name, role, message));
}

void check_dtype(const core::TensorView& t, std::span<const core::DType> allowed, std::string_view name,
                 std::string_view role) {
  bool ok = false;
  std::string expected;
  for (core::DType d : allowed) {
    ok = ok || d == t.dtype;
    if (!expected.empty()) expected += " or ";
    expected += core::dtype_name(d);
  }
  if (!ok) fail(name, role, fmt::format("has dtype {}, expected {}", core::dtype_name(t.dtype), expected));
  for (int64_t d : t.shape) {
    if (d < 0) fail(name, role, fmt::format("has a negative dimension in shape {}", core::shape_to_string(t.shape)));
  }
  const auto bits = static_cast<uint64_t>(core::dtype_bits(t.dtype));
  const uint64_t need = (static_cast<uint64_t>(t.numel()) * bits + 7) / 8;
  if (t.bytes.size() != need) {
    fail(name, role, fmt::format("holds {} bytes, expected {} for shape {}", t.bytes.size(), need,
                                 core::shape_to_string(t.shape)));
  }
}

void check_shape(const core::TensorView& t, const std::vector<int64_t>& expected, std::string_view name,
                 std::string_view role) {
  if (t.shape != expected) {
    fail(name, role, fmt::format("has shape {}, expected {}", core::shape_to_string(t.shape),
                                 core::shape_to_string(expected)));
  }
}

void init_tiles(PreparedLinear& w, WeightLayout layout, int64_t n, int64_t k, int64_t group_size,
                size_t code_bytes_per_tile, size_t scale_bytes_per_tile, size_t offset_bytes_per_tile) {
  w.layout = layout;
  w.out_features = n;
  w.in_features = k;
  w.group_size = group_size;
  w.padded_rows = (n + kTileRows - 1) / kTileRows * kTileRows;
  const auto tiles = static_cast<size_t>(w.tiles());
  w.codes = AlignedBuffer(tiles * code_bytes_per_tile);
  w.scales = AlignedBuffer(tiles * scale_bytes_per_tile);
  w.offsets = AlignedBuffer(tiles * offset_bytes_per_tile);
}

}  // namespace detail
}  // namespace fp4serve::prepare
