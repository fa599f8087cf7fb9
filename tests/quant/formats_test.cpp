// SPDX-License-Identifier: Apache-2.0
// Every code of every format decoded, and encode checked on ~150k inputs (random, ties, subnormals,
// saturation), against tables made by numpy + ml_dtypes (tools/gen_format_tables.py), never by our code.
#include "quant/formats.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "checkpoint/safetensors.h"

namespace fp4serve::quant {
namespace {

class FormatTables : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    file_ = new checkpoint::SafetensorsFile(std::string(FP4SERVE_TEST_DATA) + "/formats/format_tables.safetensors");
  }
  static void TearDownTestSuite() { delete file_; }
  static core::TensorView table(const char* name) {
    const auto* entry = file_->find(name);
    EXPECT_NE(entry, nullptr) << name;
    return file_->view(*entry);
  }
  // Same value, or both NaN (NaN payloads are compared separately on the encode side).
  static bool same(float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
  }
  static checkpoint::SafetensorsFile* file_;
};
checkpoint::SafetensorsFile* FormatTables::file_ = nullptr;

TEST_F(FormatTables, DecodesAll16E2M1Codes) {
  const auto t = table("e2m1.decode");
  ASSERT_EQ(t.numel(), 16);
  for (uint32_t c = 0; c < 16; ++c) EXPECT_TRUE(same(e2m1_to_float(static_cast<uint8_t>(c)), t.load<float>(c))) << c;
  EXPECT_EQ(e2m1_to_float(0xF7), 6.0f) << "high bits are ignored";
}

TEST_F(FormatTables, DecodesAll256E4M3E5M2AndE8M0Codes) {
  const auto e4m3 = table("e4m3.decode");
  const auto e5m2 = table("e5m2.decode");
  const auto e8m0 = table("e8m0.decode");
  for (uint32_t c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    EXPECT_TRUE(same(e4m3_to_float(code), e4m3.load<float>(c))) << "E4M3 code " << c;
    EXPECT_TRUE(same(e5m2_to_float(code), e5m2.load<float>(c))) << "E5M2 code " << c;
    EXPECT_TRUE(same(e8m0_to_float(code), e8m0.load<float>(c))) << "E8M0 code " << c;
  }
  EXPECT_TRUE(std::isinf(e8m0_to_float(255))) << "255 decodes to +inf as the reference decoders do";
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
}

TEST_F(FormatTables, DecodesAll65536HalfCodes) {
  const auto f16 = table("f16.decode");
  for (uint32_t c = 0; c < 65536; ++c) {
    ASSERT_TRUE(same(f16_to_float(static_cast<uint16_t>(c)), f16.load<float>(c))) << "F16 code " << c;
  }
}

TEST_F(FormatTables, EncodesLikeTheReferenceCasts) {
  const auto x = table("encode.inputs");
  const auto e2m1 = table("e2m1.encode");
  const auto e4m3 = table("e4m3.encode");
  const auto e5m2 = table("e5m2.encode");
  const auto bf16 = table("bf16.encode");
  const auto f16 = table("f16.encode");
  ASSERT_GT(x.numel(), 100000);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const auto k = static_cast<size_t>(i);
    const float v = x.load<float>(k);
    if (float_to_e2m1(v) != e2m1.load<uint8_t>(k)) ++mismatches, ADD_FAILURE() << "E2M1 " << v;
    if (float_to_e4m3(v) != e4m3.load<uint8_t>(k)) ++mismatches, ADD_FAILURE() << "E4M3 " << v;
    if (float_to_e5m2(v) != e5m2.load<uint8_t>(k)) ++mismatches, ADD_FAILURE() << "E5M2 " << v;
    if (float_to_bf16(v) != bf16.load<uint16_t>(k)) ++mismatches, ADD_FAILURE() << "BF16 " << v;
    if (float_to_f16(v) != f16.load<uint16_t>(k)) ++mismatches, ADD_FAILURE() << "F16 " << v;
    if (mismatches > 20) FAIL() << "too many mismatches";
  }
}

TEST_F(FormatTables, EncodesNaNLikeTheReferenceCasts) {
  const auto x = table("nan.inputs");
  for (size_t i = 0; i < 2; ++i) {
    const float v = x.load<float>(i);
    EXPECT_EQ(float_to_e4m3(v), table("nan.e4m3").load<uint8_t>(i)) << i;
    EXPECT_EQ(float_to_e5m2(v), table("nan.e5m2").load<uint8_t>(i)) << i;
    EXPECT_EQ(float_to_bf16(v), table("nan.bf16").load<uint16_t>(i)) << i;
    EXPECT_EQ(float_to_f16(v), table("nan.f16").load<uint16_t>(i)) << i;
  }
}

TEST(FormatsByHand, E2M1TiesGoToTheEvenCodeAsFormatsMdStates) {
  // FORMATS.md §0.1 thresholds: <=0.25→0; <0.75→0.5; <=1.25→1; <1.75→1.5; <=2.5→2; <3.5→3; <=5→4; else 6.
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(0.25f)), 0.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(0.75f)), 1.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(1.25f)), 1.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(1.75f)), 2.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(2.5f)), 2.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(3.5f)), 4.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(5.0f)), 4.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(-100.0f)), -6.0f);
  EXPECT_EQ(float_to_e2m1(-0.0f), 0x8);
  EXPECT_EQ(float_to_e2m1(std::nanf("")), 0x0);
  EXPECT_EQ(float_to_e4m3(1e9f), 0x7E) << "saturates to 448";
  EXPECT_EQ(float_to_e4m3(-1e9f), 0xFE);
}

TEST(FormatsByHand, TraitsTableIsInEnumOrderAndMatchesTheFormats) {
  for (size_t i = 0; i < kFormatTraits.size(); ++i) EXPECT_EQ(static_cast<size_t>(kFormatTraits[i].format), i);
  EXPECT_EQ(format_traits(ElementFormat::E2M1).max_finite, e2m1_to_float(0x7));
  EXPECT_EQ(format_traits(ElementFormat::E4M3).max_finite, e4m3_to_float(0x7E));
  EXPECT_EQ(format_traits(ElementFormat::E5M2).max_finite, e5m2_to_float(0x7B));
  EXPECT_EQ(format_traits(ElementFormat::F16).max_finite, f16_to_float(0x7BFF));
  EXPECT_EQ(format_traits(ElementFormat::E8M0).max_finite, e8m0_to_float(254));
  EXPECT_EQ(format_traits(ElementFormat::BF16).max_finite, bf16_to_float(0x7F7F));
}

}  // namespace
}  // namespace fp4serve::quant
