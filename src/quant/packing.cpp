// SPDX-License-Identifier: Apache-2.0
#include "quant/packing.h"

#include <fmt/format.h>

#include "fp4serve/error.h"

namespace fp4serve::quant {
namespace {

uint32_t offset_nibble(int8_t q, const char* what) {
  if (q < -8 || q > 7) throw UsageError(fmt::format("{}: int4 value {} is outside [-8, 7]", what, q));
  return static_cast<uint32_t>(q + 8);
}

}  // namespace

void pack_fp4(std::span<const uint8_t> codes, std::span<uint8_t> packed) {
  if (codes.size() != 2 * packed.size()) {
    throw UsageError(fmt::format("pack_fp4: {} codes need {} bytes, got {}", codes.size(), codes.size() / 2 + codes.size() % 2,
                                 packed.size()));
  }
  for (size_t j = 0; j < packed.size(); ++j) {
    packed[j] = static_cast<uint8_t>((codes[2 * j] & 0x0F) | ((codes[2 * j + 1] & 0x0F) << 4));
  }
}

void unpack_fp4(std::span<const uint8_t> packed, std::span<uint8_t> codes) {
  if (codes.size() != 2 * packed.size()) {
    throw UsageError(fmt::format("unpack_fp4: {} bytes hold {} codes, output has room for {}", packed.size(),
                                 2 * packed.size(), codes.size()));
  }
  for (size_t j = 0; j < packed.size(); ++j) {
    codes[2 * j] = fp4_even(packed[j]);
    codes[2 * j + 1] = fp4_odd(packed[j]);
  }
}

void pack_int4_row(std::span<const int8_t> q, std::span<int32_t> words) {
  if (words.size() != (q.size() + 7) / 8) {
    throw UsageError(fmt::format("pack_int4_row: {} values need {} words, got {}", q.size(), (q.size() + 7) / 8,
                                 words.size()));
  }
  for (size_t w = 0; w < words.size(); ++w) {
    uint32_t word = 0;
    for (size_t i = 0; i < 8 && 8 * w + i < q.size(); ++i) {
      word |= offset_nibble(q[8 * w + i], "pack_int4_row") << (4 * i);
    }
    words[w] = static_cast<int32_t>(word);
  }
}

void pack_int4_along_rows(std::span<const int8_t> zp, size_t rows, size_t cols, std::span<int32_t> words) {
  if (zp.size() != rows * cols || words.size() != ((rows + 7) / 8) * cols) {
    throw UsageError(fmt::format("pack_int4_along_rows: [{}, {}] needs {} values and {} words, got {} and {}", rows,
                                 cols, rows * cols, ((rows + 7) / 8) * cols, zp.size(), words.size()));
  }
  for (size_t wr = 0; wr < (rows + 7) / 8; ++wr) {
    for (size_t c = 0; c < cols; ++c) {
      uint32_t word = 0;
      for (size_t i = 0; i < 8 && 8 * wr + i < rows; ++i) {
        word |= offset_nibble(zp[(8 * wr + i) * cols + c], "pack_int4_along_rows") << (4 * i);
      }
      words[wr * cols + c] = static_cast<int32_t>(word);
    }
  }
}

}  // namespace fp4serve::quant
