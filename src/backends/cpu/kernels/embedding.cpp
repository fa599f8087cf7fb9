// SPDX-License-Identifier: Apache-2.0
#include "backends/cpu/kernels/embedding.h"

#include <cstring>

#include <fmt/format.h>

#include "fp4serve/error.h"
#include "quant/formats.h"

namespace fp4serve::kernels {

void embedding_gather(const core::TensorView& table, const int32_t* ids, int64_t count, float* out) {
  if (table.shape.size() != 2 || table.shape[0] < 1 || table.shape[1] < 1) {
    throw UnsupportedError(fmt::format("embedding_gather: table must be [vocab, dim] with both >= 1, found {}",
                                       core::shape_to_string(table.shape)));
  }
  const core::DType dtype = table.dtype;
  if (dtype != core::DType::BF16 && dtype != core::DType::F16 && dtype != core::DType::F32) {
    throw UnsupportedError(fmt::format("embedding_gather: table dtype {} is not supported (BF16, F16, F32)",
                                       core::dtype_name(dtype)));
  }
  const int64_t vocab = table.shape[0];
  const int64_t dim = table.shape[1];
  const size_t elem = core::dtype_bits(dtype) / 8;
  if (table.bytes.size() != static_cast<size_t>(vocab * dim) * elem) {
    throw UnsupportedError(fmt::format("embedding_gather: table {} {} holds {} bytes, expected {}",
                                       core::dtype_name(dtype), core::shape_to_string(table.shape),
                                       table.bytes.size(), static_cast<size_t>(vocab * dim) * elem));
  }
  if (count < 0) throw UsageError(fmt::format("embedding_gather: count {} must be >= 0", count));
  if (count == 0) return;
  if (ids == nullptr || out == nullptr) throw UsageError("embedding_gather: null pointer");
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      throw UsageError(fmt::format("embedding_gather: token id {} at position {} is outside the vocabulary [0, {})",
                                   ids[i], i, vocab));
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    const size_t base = static_cast<size_t>(ids[i]) * static_cast<size_t>(dim);
    float* dst = out + i * dim;
    switch (dtype) {
      case core::DType::F32:
        std::memcpy(dst, table.bytes.data() + base * sizeof(float), static_cast<size_t>(dim) * sizeof(float));
        break;
      case core::DType::BF16:
        for (int64_t j = 0; j < dim; ++j) dst[j] = quant::bf16_to_float(table.load<uint16_t>(base + j));
        break;
      case core::DType::F16:
        for (int64_t j = 0; j < dim; ++j) dst[j] = quant::f16_to_float(table.load<uint16_t>(base + j));
        break;
      case core::DType::Bool:
      case core::DType::U8:
      case core::DType::I8:
      case core::DType::I16:
      case core::DType::U16:
      case core::DType::I32:
      case core::DType::U32:
      case core::DType::I64:
      case core::DType::U64:
      case core::DType::F64:
      case core::DType::F8_E4M3:
      case core::DType::F8_E5M2:
      case core::DType::F8_E8M0:
      case core::DType::F8_E4M3FNUZ:
      case core::DType::F8_E5M2FNUZ:
      case core::DType::F4:
      case core::DType::F6_E2M3:
      case core::DType::F6_E3M2:
      case core::DType::C64:
        break;  // rejected above
    }
  }
}

}  // namespace fp4serve::kernels
