// SPDX-License-Identifier: Apache-2.0
// A non-owning view of one tensor's bytes (usually inside a memory-mapped safetensors shard).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace fp4serve::core {

/// Shape, dtype and bytes of a tensor, row-major (C order), little-endian, no strides, as safetensors stores
/// it. The bytes are not guaranteed to be aligned for the element type: read elements with `load<T>()`.
struct TensorView {
  DType dtype = DType::U8;
  std::vector<int64_t> shape;       ///< logical elements per dimension; empty for a 0-d scalar
  std::span<const std::byte> bytes;  ///< ceil(numel · dtype_bits / 8) bytes

  /// Number of elements (1 for a 0-d tensor, 0 when any dimension is 0).
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }

  /// Element `i` of a tensor whose elements are `sizeof(T)` bytes, read with memcpy (unaligned-safe).
  /// Precondition: (i + 1) · sizeof(T) ≤ bytes.size(); checked by the callers that build views.
  template <typename T>
  T load(size_t i) const {
    T value;
    std::memcpy(&value, bytes.data() + i * sizeof(T), sizeof(T));
    return value;
  }
};

/// "[a, b, c]" for messages and tables.
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace fp4serve::core
