// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "fp4serve/error.h"

namespace fp4serve::checkpoint {
namespace {

const std::string kData = FP4SERVE_TEST_DATA;

TEST(Safetensors, ReadsAFileWrittenByTheReferenceWriter) {
  // format_tables.safetensors is written by the `safetensors` Python package (tools/gen_format_tables.py).
  const SafetensorsFile file(kData + "/formats/format_tables.safetensors");
  const TensorEntry* e2m1 = file.find("e2m1.decode");
  ASSERT_NE(e2m1, nullptr);
  EXPECT_EQ(e2m1->dtype, core::DType::F32);
  EXPECT_EQ(e2m1->shape, std::vector<int64_t>{16});
  const core::TensorView v = file.view(*e2m1);
  const float expected[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -.5f, -1, -1.5f, -2, -3, -4, -6};
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(v.load<float>(i), expected[i]) << i;
  EXPECT_EQ(file.header().metadata.at("generator"), "tools/gen_format_tables.py");
  EXPECT_EQ(file.find("no.such.tensor"), nullptr);
}

TEST(Safetensors, AcceptsScalarsEmptyTensorsAndSubByteDtypes) {
  const SafetensorsFile file(kData + "/valid/scalar_and_empty.safetensors");
  const TensorEntry* scalar = file.find("scalar");
  ASSERT_NE(scalar, nullptr);
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(file.view(*scalar).numel(), 1);
  EXPECT_EQ(file.view(*scalar).load<float>(0), 3.5f);
  const TensorEntry* empty = file.find("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(file.view(*empty).numel(), 0);
  EXPECT_EQ(file.view(*empty).bytes.size(), 0u);
  const TensorEntry* fp4 = file.find("fp4");
  ASSERT_NE(fp4, nullptr);
  EXPECT_EQ(fp4->end - fp4->begin, 4u);  // 8 F4 elements = 4 bytes
}

TEST(Safetensors, AcceptsNullMetadataNoTensorsAndUnpaddedHeaders) {
  EXPECT_TRUE(SafetensorsFile(kData + "/valid/null_metadata.safetensors").header().metadata.empty());
  const SafetensorsFile none(kData + "/valid/no_tensors.safetensors");
  EXPECT_TRUE(none.header().tensors.empty());
  EXPECT_EQ(none.header().metadata.at("format"), "pt");
  EXPECT_EQ(SafetensorsFile(kData + "/valid/unpadded_header.safetensors").header().tensors.size(), 1u);
}

// Builds a file image in memory: the parser takes a span, which is how the fuzzer drives it too.
std::vector<std::byte> image(const std::string& header, size_t data_bytes) {
  std::vector<std::byte> out(8 + header.size() + data_bytes, std::byte{0x5A});
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = std::byte(static_cast<uint8_t>(n >> (8 * i)));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

TEST(Safetensors, SortsEntriesByOffsetAndChecksCoverage) {
  const auto bytes = image(R"({"b":{"dtype":"U8","shape":[3],"data_offsets":[4,7]},)"
                           R"("a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
                           7);
  const SafetensorsHeader h = parse_safetensors_header(bytes, "mem");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.data_bytes, 7u);
  EXPECT_THROW(parse_safetensors_header(image(R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", 5), "mem"),
               FormatError);
}

TEST(Safetensors, EveryTruncationOfAValidFileIsRefusedCleanly) {
  const auto bytes = image(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"__metadata__":{"k":"v"}})", 24);
  ASSERT_NO_THROW(parse_safetensors_header(bytes, "mem"));
  for (size_t len = 0; len < bytes.size(); ++len) {
    EXPECT_THROW(parse_safetensors_header(std::span(bytes).first(len), "mem"), FormatError) << "length " << len;
  }
}

}  // namespace
}  // namespace fp4serve::checkpoint
