// SPDX-License-Identifier: Apache-2.0
#include "core/dtype.h"

#include <gtest/gtest.h>

namespace fp4serve::core {
namespace {

TEST(DType, EveryTagRoundTripsAndHasTheSafetensorsSize) {
  // Sizes from the safetensors spec (huggingface/safetensors Dtype::bitsize), written out independently.
  const std::pair<const char*, uint32_t> expected[] = {
      {"BOOL", 8}, {"U8", 8}, {"I8", 8}, {"I16", 16}, {"U16", 16}, {"I32", 32}, {"U32", 32}, {"I64", 64},
      {"U64", 64}, {"F16", 16}, {"BF16", 16}, {"F32", 32}, {"F64", 64}, {"F8_E4M3", 8}, {"F8_E5M2", 8},
      {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"F4", 4}, {"F6_E2M3", 6}, {"F6_E3M2", 6},
      {"C64", 64}};
  for (const auto& [tag, bits] : expected) {
    const auto parsed = parse_dtype(tag);
    ASSERT_TRUE(parsed.has_value()) << tag;
    EXPECT_EQ(dtype_name(*parsed), tag);
    EXPECT_EQ(dtype_bits(*parsed), bits) << tag;
  }
}

TEST(DType, UnknownAndMiscasedTagsAreRejected) {
  EXPECT_FALSE(parse_dtype("F7").has_value());
  EXPECT_FALSE(parse_dtype("f32").has_value());
  EXPECT_FALSE(parse_dtype("").has_value());
  EXPECT_FALSE(parse_dtype("F8_E4M3FN").has_value());
}

}  // namespace
}  // namespace fp4serve::core
