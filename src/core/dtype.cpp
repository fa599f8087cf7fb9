// SPDX-License-Identifier: Apache-2.0
#include "core/dtype.h"

#include <array>
#include <utility>

namespace fp4serve::core {
namespace {

struct DTypeRow {
  DType dtype;
  std::string_view name;
  uint32_t bits;
};

// One row per DType, in enum order (checked by a static_assert below).
constexpr std::array<DTypeRow, 22> kDTypes{{
    {DType::Bool, "BOOL", 8},          {DType::U8, "U8", 8},
    {DType::I8, "I8", 8},              {DType::I16, "I16", 16},
    {DType::U16, "U16", 16},           {DType::I32, "I32", 32},
    {DType::U32, "U32", 32},           {DType::I64, "I64", 64},
    {DType::U64, "U64", 64},           {DType::F16, "F16", 16},
    {DType::BF16, "BF16", 16},         {DType::F32, "F32", 32},
    {DType::F64, "F64", 64},           {DType::F8_E4M3, "F8_E4M3", 8},
    {DType::F8_E5M2, "F8_E5M2", 8},    {DType::F8_E8M0, "F8_E8M0", 8},
    {DType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8}, {DType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {DType::F4, "F4", 4},              {DType::F6_E2M3, "F6_E2M3", 6},
    {DType::F6_E3M2, "F6_E3M2", 6},    {DType::C64, "C64", 64},
}};

constexpr bool rows_in_enum_order() {
  for (size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(rows_in_enum_order(), "kDTypes must list every DType in declaration order");

}  // namespace

uint32_t dtype_bits(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].bits; }

std::string_view dtype_name(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].name; }

std::optional<DType> parse_dtype(std::string_view tag) {
  for (const DTypeRow& row : kDTypes) {
    if (row.name == tag) return row.dtype;
  }
  return std::nullopt;
}

}  // namespace fp4serve::core
