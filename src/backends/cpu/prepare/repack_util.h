// SPDX-License-Identifier: Apache-2.0
// Validation and element-reading helpers shared by the repack translation units (not a public API).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <span>
#include <string_view>
#include <vector>

#include "core/tensor_view.h"
#include "fp4serve/error.h"
#include "backends/cpu/prepare/prepared_linear.h"
#include "quant/linear_weights.h"

namespace fp4serve::prepare::detail {

// The tensor checks every device's repack shares (quant/linear_weights.h), under their short names here.
[[noreturn]] inline void fail(std::string_view name, std::string_view role, const std::string& message) {
  quant::fail_tensor(name, role, message);
}
inline void check_dtype(const core::TensorView& t, std::initializer_list<core::DType> allowed, std::string_view name,
                        std::string_view role) {
  quant::check_tensor_dtype(t, std::span<const core::DType>(allowed.begin(), allowed.size()), name, role);
}
inline void check_shape(const core::TensorView& t, const std::vector<int64_t>& expected, std::string_view name,
                        std::string_view role) {
  quant::check_tensor_shape(t, expected, name, role);
}

/// padded rows and zeroed buffers for a layout with `code_bytes` and `scale_bytes` per tile.
void init_tiles(PreparedLinear& w, WeightLayout layout, int64_t n, int64_t k, int64_t group_size,
                size_t code_bytes_per_tile, size_t scale_bytes_per_tile, size_t offset_bytes_per_tile);

/// Writes 8 nibbles (columns 8c..8c+7 of row r, low 4 bits of each entry) into the interleaved FP4/int4
/// tile block `block` (32 bytes of tile t, octet c) — see the layout comment in prepared_linear.h.
inline void put_octet(uint8_t* block, int64_t r, const uint8_t nib[8]) {
  for (int j = 0; j < 4; ++j) {
    block[4 * r + j] = static_cast<uint8_t>((nib[2 * j] & 0x0F) | ((nib[2 * j + 1] & 0x0F) << 4));
  }
}

/// Inverse of put_octet for one column j (0..7) of row r.
inline uint8_t get_nibble(const uint8_t* block, int64_t r, int64_t j) {
  const uint8_t byte = block[4 * r + j / 2];
  return j % 2 == 0 ? (byte & 0x0F) : static_cast<uint8_t>(byte >> 4);
}

}  // namespace fp4serve::prepare::detail
