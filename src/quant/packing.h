// SPDX-License-Identifier: Apache-2.0
// Sub-byte packing exactly as the producers write it (FORMATS.md §0.1, §0.4, §2.3).
#pragma once

#include <cstdint>
#include <span>

namespace fp4serve::quant {

/// FP4 pair packing: byte j of a row holds element 2j in the LOW nibble and element 2j+1 in the HIGH nibble
/// (compressed-tensors `pack_fp4_to_uint8`, ModelOpt, HF mxfp4 all agree).
inline uint8_t fp4_even(uint8_t byte) { return byte & 0x0F; }
inline uint8_t fp4_odd(uint8_t byte) { return static_cast<uint8_t>(byte >> 4); }

/// Packs E2M1 codes (low 4 bits used) two per byte. Requires codes.size() == 2 · packed.size(); throws UsageError.
void pack_fp4(std::span<const uint8_t> codes, std::span<uint8_t> packed);

/// Unpacks bytes into 2 · packed.size() codes. Requires codes.size() == 2 · packed.size(); throws UsageError.
void unpack_fp4(std::span<const uint8_t> packed, std::span<uint8_t> codes);

/// compressed-tensors pack-quantized int4 along a row: element i occupies bits [4·(i mod 8), +4) of word i/8,
/// stored as q + 8 (q ∈ [−8, 7]); the tail of the last word is zero. Requires words.size() == ceil(q.size()/8);
/// throws UsageError on a size mismatch or a value outside [−8, 7].
void pack_int4_row(std::span<const int8_t> q, std::span<int32_t> words);

/// Element `i` (0-based) of an int4 row packed by pack_int4_row, returned as q = nibble − 8.
inline int8_t unpack_int4(std::span<const int32_t> words, size_t i) {
  const auto word = static_cast<uint32_t>(words[i / 8]);
  return static_cast<int8_t>(static_cast<int>((word >> (4 * (i % 8))) & 0xFu) - 8);
}

/// Zero points of asymmetric int4 are packed along ROWS (dim 0): `zp` is [rows, cols] row-major with values in
/// [−8, 7]; the result `words` is [ceil(rows/8), cols] where word (r/8, c) holds row r's nibble at bits
/// 4·(r mod 8), stored zp + 8. Throws UsageError on a size mismatch or an out-of-range value.
void pack_int4_along_rows(std::span<const int8_t> zp, size_t rows, size_t cols, std::span<int32_t> words);

/// Zero point (row, col) of a [rows, cols] tensor packed by pack_int4_along_rows, as zp = nibble − 8.
inline int8_t unpack_int4_along_rows(std::span<const int32_t> words, size_t cols, size_t row, size_t col) {
  const auto word = static_cast<uint32_t>(words[(row / 8) * cols + col]);
  return static_cast<int8_t>(static_cast<int>((word >> (4 * (row % 8))) & 0xFu) - 8);
}

}  // namespace fp4serve::quant
