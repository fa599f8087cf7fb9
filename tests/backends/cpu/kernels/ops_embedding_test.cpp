// SPDX-License-Identifier: Apache-2.0
// embedding_gather on BF16 / F16 / F32 tables built here, with decoders written independently in the test.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/kernels/embedding.h"
#include "backends/cpu/kernels/ops_test_util.h"
#include "core/tensor_view.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels {
namespace {

using testing::poisoned;
using testing::random_nonzero;

// IEEE binary16 → double by its definition: (−1)^s · 2^(e−15) · (1 + m/1024), subnormals 2^−14 · m/1024.
double f16_ref(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const double mag = e == 0 ? std::ldexp(m / 1024.0, -14) : std::ldexp(1 + m / 1024.0, e - 15);
  return s ? -mag : mag;
}
double bf16_ref(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct Table {
  std::vector<std::byte> storage;  // one extra leading byte so the view is misaligned on purpose
  core::TensorView view;
};

Table make_table(core::DType dtype, int64_t vocab, int64_t dim, uint32_t seed) {
  Table t;
  const size_t elem = dtype == core::DType::F32 ? 4 : 2;
  t.storage.resize(1 + vocab * dim * elem);
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < vocab * dim; ++i) {
    if (dtype == core::DType::F32) {
      const float f = random_nonzero(1, rng())[0];
      std::memcpy(t.storage.data() + 1 + i * 4, &f, 4);
    } else {
      // Random finite 16-bit patterns: exponent field kept below all-ones (no inf/NaN), subnormals included.
      uint16_t bits;
      do bits = uint16_t(rng()); while (dtype == core::DType::F16 ? ((bits >> 10) & 31) == 31 : ((bits >> 7) & 255) == 255);
      std::memcpy(t.storage.data() + 1 + i * 2, &bits, 2);
    }
  }
  t.view.dtype = dtype;
  t.view.shape = {vocab, dim};
  t.view.bytes = std::span<const std::byte>(t.storage.data() + 1, t.storage.size() - 1);
  return t;
}

TEST(Embedding, GathersEveryDtypeExactly) {
  const int64_t vocab = 53, dim = 19;
  const std::vector<int32_t> ids = {0, 52, 17, 17, 3, 40, 1};
  for (core::DType dtype : {core::DType::BF16, core::DType::F16, core::DType::F32}) {
    const Table t = make_table(dtype, vocab, dim, 9);
    std::vector<float> out = poisoned(ids.size() * dim);
    embedding_gather(t.view, ids.data(), static_cast<int64_t>(ids.size()), out.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int64_t j = 0; j < dim; ++j) {
        const size_t e = size_t(ids[i]) * dim + j;
        double want;
        if (dtype == core::DType::F32) {
          float f;
          std::memcpy(&f, t.view.bytes.data() + e * 4, 4);
          want = f;
        } else {
          uint16_t bits;
          std::memcpy(&bits, t.view.bytes.data() + e * 2, 2);
          want = dtype == core::DType::F16 ? f16_ref(bits) : bf16_ref(bits);
        }
        ASSERT_EQ(double(out[i * dim + j]), want) << core::dtype_name(dtype) << " row " << i << " col " << j;
      }
    }
  }
}

TEST(Embedding, OutOfRangeIdNamesIt) {
  const Table t = make_table(core::DType::BF16, 10, 4, 1);
  const int32_t ids[3] = {2, 10, 1};
  std::vector<float> out(12);
  try {
    embedding_gather(t.view, ids, 3, out.data());
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 10 at position 1"), std::string::npos) << e.what();
  }
  const int32_t negative = -1;
  EXPECT_THROW(embedding_gather(t.view, &negative, 1, out.data()), UsageError);
}

TEST(Embedding, RejectsBadTables) {
  Table t = make_table(core::DType::F32, 4, 3, 2);
  std::vector<float> out(3);
  const int32_t id = 0;
  core::TensorView bad = t.view;
  bad.dtype = core::DType::I32;
  EXPECT_THROW(embedding_gather(bad, &id, 1, out.data()), UnsupportedError);
  bad = t.view;
  bad.shape = {12};
  EXPECT_THROW(embedding_gather(bad, &id, 1, out.data()), UnsupportedError);
  bad = t.view;
  bad.shape = {5, 3};  // more rows than bytes
  EXPECT_THROW(embedding_gather(bad, &id, 1, out.data()), UnsupportedError);
}

}  // namespace
}  // namespace fp4serve::kernels
