// SPDX-License-Identifier: Apache-2.0
#include "quant/dequant_digest.h"  // tests/quant (tests/ is on the include path)

#include <openssl/evp.h>

#include <bit>
#include <cstring>
#include <sstream>

#include "fp4serve/error.h"
#include "quant/formats.h"

namespace fp4serve::quant::digest {

std::array<uint8_t, 32> sha256(std::span<const uint8_t> bytes) {
  std::array<uint8_t, 32> out{};
  unsigned int n = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), out.data(), &n, EVP_sha256(), nullptr) != 1 || n != out.size()) {
    throw UsageError("sha256: OpenSSL EVP_Digest failed");
  }
  return out;
}

std::vector<uint8_t> reference_bytes(core::DType dtype, std::span<const float> values) {
  if (dtype != core::DType::BF16 && dtype != core::DType::F16 && dtype != core::DType::F32) {
    throw UsageError("reference_bytes: dequantized weights are BF16, F16 or F32, not " +
                     std::string(core::dtype_name(dtype)));
  }
  std::vector<uint8_t> out;
  out.reserve(values.size() * (dtype == core::DType::F32 ? 4 : 2));
  auto put = [&out](auto bits) {
    for (size_t b = 0; b < sizeof(bits); ++b) out.push_back(static_cast<uint8_t>(bits >> (8 * b)));
  };
  for (float v : values) {
    if (dtype == core::DType::BF16) {
      put(float_to_bf16(v));
    } else if (dtype == core::DType::F16) {
      put(float_to_f16(v));
    } else {
      put(std::bit_cast<uint32_t>(v));
    }
  }
  return out;
}

namespace {

core::TensorView entry_view(const checkpoint::SafetensorsFile& golden, const std::string& name) {
  const checkpoint::TensorEntry* e = golden.find(name);
  if (e == nullptr) throw FormatError(golden.path().string() + ": no tensor '" + name + "'");
  return golden.view(*e);
}

void expect_dtype(const checkpoint::SafetensorsFile& golden, const std::string& name, const core::TensorView& t,
                  core::DType want, size_t ndim) {
  if (t.dtype != want || t.shape.size() != ndim) {
    throw FormatError(golden.path().string() + ": '" + name + "' is " + std::string(core::dtype_name(t.dtype)) +
                      " " + core::shape_to_string(t.shape) + ", expected " +
                      std::string(core::dtype_name(want)) + " with " + std::to_string(ndim) + " dimension(s)");
  }
}

size_t element_bytes(core::DType dtype) {
  return dtype == core::DType::F32 ? 4 : 2;
}

}  // namespace

core::DType digest_dtype(const checkpoint::SafetensorsFile& golden, const std::string& module) {
  return entry_view(golden, "dequant_rows." + module).dtype;
}

DigestComparison compare_with_digest(const checkpoint::SafetensorsFile& golden, const std::string& module,
                                     std::span<const uint8_t> ours, int64_t rows, int64_t cols) {
  const std::string hash_name = std::string(kDigestPrefix) + module;
  const core::TensorView hash = entry_view(golden, hash_name);
  expect_dtype(golden, hash_name, hash, core::DType::U8, 1);
  if (hash.shape[0] != 32) throw FormatError(golden.path().string() + ": '" + hash_name + "' is not 32 bytes");
  const core::TensorView shape = entry_view(golden, "dequant_shape." + module);
  expect_dtype(golden, "dequant_shape." + module, shape, core::DType::I64, 1);
  const core::TensorView index = entry_view(golden, "dequant_row_index." + module);
  expect_dtype(golden, "dequant_row_index." + module, index, core::DType::I64, 1);
  const core::TensorView want_rows = entry_view(golden, "dequant_rows." + module);
  const core::DType dtype = want_rows.dtype;
  if (dtype != core::DType::BF16 && dtype != core::DType::F16 && dtype != core::DType::F32) {
    expect_dtype(golden, "dequant_rows." + module, want_rows, core::DType::BF16, 2);
  }
  const size_t esize = element_bytes(dtype);
  if (ours.size() != static_cast<size_t>(rows * cols) * esize) {
    throw UsageError("compare_with_digest(" + module + "): " + std::to_string(ours.size()) + " bytes for [" +
                     std::to_string(rows) + ", " + std::to_string(cols) + "] " + std::string(core::dtype_name(dtype)));
  }

  DigestComparison r;
  int64_t numel = 1;
  for (int64_t i = 0; i < shape.numel(); ++i) numel *= shape.load<int64_t>(static_cast<size_t>(i));
  r.shape_equal = shape.numel() > 0 && numel == rows * cols &&
                  shape.load<int64_t>(static_cast<size_t>(shape.numel() - 1)) == cols;

  const std::array<uint8_t, 32> got = sha256(ours);
  r.hash_equal = std::memcmp(got.data(), hash.bytes.data(), got.size()) == 0;

  if (want_rows.shape.size() != 2 || want_rows.shape[0] != index.shape[0] || want_rows.shape[1] != cols) {
    throw FormatError(golden.path().string() + ": 'dequant_rows." + module + "' is " +
                      core::shape_to_string(want_rows.shape) + ", expected [" + std::to_string(index.shape[0]) +
                      ", " + std::to_string(cols) + "]");
  }
  const size_t row_bytes = static_cast<size_t>(cols) * esize;
  for (int64_t k = 0; k < index.shape[0]; ++k) {
    const int64_t row = index.load<int64_t>(static_cast<size_t>(k));
    if (row < 0 || row >= rows) {
      throw FormatError(golden.path().string() + ": 'dequant_row_index." + module + "' holds row " +
                        std::to_string(row) + ", the tensor has " + std::to_string(rows));
    }
    const uint8_t* a = reinterpret_cast<const uint8_t*>(want_rows.bytes.data()) + static_cast<size_t>(k) * row_bytes;
    const uint8_t* b = ours.data() + static_cast<size_t>(row) * row_bytes;
    for (int64_t c = 0; c < cols; ++c) {
      uint32_t wa = 0, wb = 0;
      std::memcpy(&wa, a + static_cast<size_t>(c) * esize, esize);
      std::memcpy(&wb, b + static_cast<size_t>(c) * esize, esize);
      if (wa == wb) continue;
      if (r.elements_differing++ == 0) {
        std::ostringstream s;
        s << "row " << row << " col " << c << ": reference 0x" << std::hex << wa << ", ours 0x" << wb;
        r.first_difference = s.str();
      }
    }
    ++r.rows_compared;
  }
  return r;
}

}  // namespace fp4serve::quant::digest
