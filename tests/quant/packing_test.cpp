// SPDX-License-Identifier: Apache-2.0
// Packing layouts checked against byte patterns written out by hand from FORMATS.md §0.1, §0.4, §2.3.
#include "quant/packing.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "fp4serve/error.h"

namespace fp4serve::quant {
namespace {

TEST(Fp4Packing, EvenElementInLowNibble) {
  const std::vector<uint8_t> codes = {0x1, 0x2, 0xF, 0x0, 0x7, 0x9};
  std::vector<uint8_t> packed(3);
  pack_fp4(codes, packed);
  EXPECT_EQ(packed, (std::vector<uint8_t>{0x21, 0x0F, 0x97}));
  std::vector<uint8_t> back(6);
  unpack_fp4(packed, back);
  EXPECT_EQ(back, codes);
  EXPECT_THROW(pack_fp4(codes, std::span<uint8_t>(packed).first(2)), UsageError);
}

TEST(Int4Packing, ElementZeroInLowBitsWithOffset8) {
  // q = [-8, -1, 0, 7, 1, 2, 3, 4, 5] → nibbles [0, 7, 8, 15, 9, 10, 11, 12 | 13]
  const std::vector<int8_t> q = {-8, -1, 0, 7, 1, 2, 3, 4, 5};
  std::vector<int32_t> words(2);
  pack_int4_row(q, words);
  EXPECT_EQ(static_cast<uint32_t>(words[0]), 0xCBA9F870u);
  EXPECT_EQ(static_cast<uint32_t>(words[1]), 0x0000000Du) << "tail of the last word is zero";
  for (size_t i = 0; i < q.size(); ++i) EXPECT_EQ(unpack_int4(words, i), q[i]) << i;
  const std::vector<int8_t> out_of_range = {8};
  EXPECT_THROW(pack_int4_row(out_of_range, std::span<int32_t>(words).first(1)), UsageError);
}

TEST(Int4Packing, ZeroPointsPackAlongRows) {
  // zp is [rows=9, cols=2]; column c of rows 0..7 goes into word (0, c), row 8 into word (1, c).
  std::vector<int8_t> zp(18);
  for (size_t r = 0; r < 9; ++r) {
    zp[r * 2 + 0] = static_cast<int8_t>(static_cast<int>(r) - 4);
    zp[r * 2 + 1] = static_cast<int8_t>(3 - static_cast<int>(r) % 8);
  }
  std::vector<int32_t> words(4);
  pack_int4_along_rows(zp, 9, 2, words);
  // column 0 nibbles rows 0..7: r-4+8 = 4..11 → 0xBA987654
  EXPECT_EQ(static_cast<uint32_t>(words[0]), 0xBA987654u);
  // column 1 nibbles: 3-r+8 = 11..4 → 0x456789AB
  EXPECT_EQ(static_cast<uint32_t>(words[1]), 0x456789ABu);
  EXPECT_EQ(static_cast<uint32_t>(words[2]), 12u) << "row 8, col 0: 8-4+8";
  EXPECT_EQ(static_cast<uint32_t>(words[3]), 11u) << "row 8, col 1: 3-0+8";
  std::mt19937 rng(5);
  for (size_t r = 0; r < 9; ++r)
    for (size_t c = 0; c < 2; ++c) EXPECT_EQ(unpack_int4_along_rows(words, 2, r, c), zp[r * 2 + c]);
}

}  // namespace
}  // namespace fp4serve::quant
