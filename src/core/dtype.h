// SPDX-License-Identifier: Apache-2.0
// Storage dtypes as safetensors names them. Shared by the checkpoint reader and every later module.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace fp4serve::core {

/// Element types of the safetensors container (huggingface/safetensors `Dtype`, FORMATS.md §6).
enum class DType : uint8_t {
  Bool, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64,
  F8_E4M3, F8_E5M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, F4, F6_E2M3, F6_E3M2, C64,
};

/// Bits one element occupies in the file (4 for F4, 6 for the F6 types, 8·bytes otherwise).
uint32_t dtype_bits(DType dtype);

/// The safetensors tag of `dtype`, e.g. "F8_E4M3".
std::string_view dtype_name(DType dtype);

/// Parses a safetensors tag; std::nullopt when the tag is unknown (the caller builds the error message).
std::optional<DType> parse_dtype(std::string_view tag);

}  // namespace fp4serve::core
