// SPDX-License-Identifier: Apache-2.0
// Element-space slices of checkpoint tensors for tensor-parallel shards (plan/shard.h), taken before repack so
// that codes and scales of one shard are cut at the same element boundaries and then prepared exactly as a whole
// checkpoint tensor would be. Offsets are in the tensor's stored units (a packed FP4 byte holds 2 elements, an
// int4 I32 word 8); the caller converts element ranges, which plan/shard.h keeps on group boundaries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/tensor_view.h"

namespace fp4serve::quant {

/// Owned bytes and a view over them (moving keeps the view valid, copying does not).
struct OwnedTensor {
  std::vector<std::byte> bytes;
  core::TensorView view;
  OwnedTensor() = default;
  OwnedTensor(OwnedTensor&&) noexcept = default;
  OwnedTensor& operator=(OwnedTensor&&) noexcept = default;
  OwnedTensor(const OwnedTensor&) = delete;
  OwnedTensor& operator=(const OwnedTensor&) = delete;
};

/// Rows [begin, end) of dimension 0 of `t` (any rank ≥ 1, byte-sized dtype). Throws FormatError naming `name`
/// when the range lies outside the tensor or the dtype is narrower than a byte.
OwnedTensor slice_rows(const core::TensorView& t, int64_t begin, int64_t end, std::string_view name);

/// Columns [begin, end) of the last dimension of a 2-D `t` (byte-sized dtype). Throws FormatError naming `name`
/// when `t` is not 2-D or the range lies outside it.
OwnedTensor slice_columns(const core::TensorView& t, int64_t begin, int64_t end, std::string_view name);

/// Rows [begin, end) of an int4 tensor packed 8 per I32 word along dimension 0 ([ceil(N/8), G], compressed-tensors
/// `weight_zero_point`), repacked so that row `begin` becomes nibble 0 of word 0. Throws FormatError naming
/// `name` for a dtype other than I32, a shape other than 2-D, or a range outside 0 … 8·rows.
OwnedTensor slice_packed_int4_rows(const core::TensorView& t, int64_t begin, int64_t end, std::string_view name);

}  // namespace fp4serve::quant
