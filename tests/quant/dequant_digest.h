// SPDX-License-Identifier: Apache-2.0
// Test helper: compares our dequantization of a whole Linear with a reference stored as a digest plus sampled
// rows (tools/reference/slim_goldens.py writes that form, tests/data/ref/README.md describes it):
//   dequant_sha256.<module>     U8  [32]     SHA-256 of the reference tensor's bytes (row-major, little-endian)
//   dequant_shape.<module>      I64 [ndim]   the reference tensor's shape
//   dequant_row_index.<module>  I64 [r]      row indices into the tensor viewed as [prod(shape[:-1]), K]
//   dequant_rows.<module>       BF16/F16/F32 [r, K]  those rows, exact
// The digest makes the check as strict as comparing every element (any changed bit changes the hash); the rows
// say which values differ when it fails.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/dtype.h"

namespace fp4serve::quant::digest {

/// Prefix of the digest entries; the module name follows it.
inline constexpr std::string_view kDigestPrefix = "dequant_sha256.";

/// SHA-256 (FIPS 180-4) of `bytes`, computed by OpenSSL's libcrypto.
std::array<uint8_t, 32> sha256(std::span<const uint8_t> bytes);

/// Little-endian bytes of `values` rounded to `dtype` (BF16 and F16 with round-to-nearest-even, as
/// compressed-tensors/torch do; F32 as is). Throws UsageError for any other dtype.
std::vector<uint8_t> reference_bytes(core::DType dtype, std::span<const float> values);

/// Outcome of comparing one module.
struct DigestComparison {
  bool shape_equal = false;      ///< dequant_shape matches (numel and last dimension of ours)
  bool hash_equal = false;       ///< SHA-256 of our bytes == dequant_sha256
  int64_t rows_compared = 0;     ///< sampled rows compared
  int64_t elements_differing = 0;  ///< elements of the sampled rows whose bits differ
  std::string first_difference;  ///< "row r col c: reference 0x…, ours 0x…" for the first differing element
  bool ok() const { return shape_equal && hash_equal && elements_differing == 0; }
};

/// The dtype of the reference tensor of `module` (the dtype of `dequant_rows.<module>`). Throws FormatError
/// naming the file when an entry is missing.
core::DType digest_dtype(const checkpoint::SafetensorsFile& golden, const std::string& module);

/// Compares `ours` (the little-endian bytes of our dequantization of `module` in digest_dtype, [rows, cols]
/// row-major) with the digest entries of `module` in `golden`. Throws FormatError when an entry is missing or
/// malformed (wrong dtype/shape, row index out of range).
DigestComparison compare_with_digest(const checkpoint::SafetensorsFile& golden, const std::string& module,
                                     std::span<const uint8_t> ours, int64_t rows, int64_t cols);

}  // namespace fp4serve::quant::digest
