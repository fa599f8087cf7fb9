// SPDX-License-Identifier: Apache-2.0
// Helpers the model suites share: the reference-fixture folder, token ids from a golden file, host views of
// vectors, the ±1 Sylvester Hadamard matrix in float64, seeded activations. One definition each, which a unity
// build of the suite (FP4SERVE_UNITY_TESTS) also needs.
#pragma once

#include <bit>
#include <cstdint>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/tensor_view.h"

namespace fp4serve::model::test_support {

/// tests/data/ref: the fixtures tools/reference makes with transformers and compressed-tensors.
inline const std::filesystem::path kRef = std::filesystem::path(FP4SERVE_TEST_DATA) / "ref";

/// The int64 token ids stored under `name` in a golden file, as int32.
inline std::vector<int32_t> ids_of(const checkpoint::SafetensorsFile& golden, const std::string& name) {
  const auto view = golden.view(*golden.find(name));
  std::vector<int32_t> ids(static_cast<size_t>(view.numel()));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(view.load<int64_t>(i));
  return ids;
}

/// A view of `v` (which must outlive it) with the given dtype and shape.
template <class T>
core::TensorView view_of(const std::vector<T>& v, core::DType dtype, std::vector<int64_t> shape) {
  return {dtype, std::move(shape), std::as_bytes(std::span<const T>(v))};
}

inline core::TensorView f32_view(const std::vector<float>& v, std::vector<int64_t> shape) {
  return view_of(v, core::DType::F32, std::move(shape));
}

/// H_b [b, b] with entries ±1 (Sylvester: H[i][j] = (−1)^popcount(i & j)), b a power of two.
inline std::vector<double> sylvester(int64_t b) {
  std::vector<double> h(static_cast<size_t>(b * b));
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < b; ++j) {
      h[static_cast<size_t>(i * b + j)] = (std::popcount(static_cast<uint64_t>(i & j)) & 1) ? -1.0 : 1.0;
    }
  }
  return h;
}

/// `count` standard-normal floats from `seed`, none of them zero.
inline std::vector<float> random_x(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(count));
  for (float& v : x) {
    v = d(rng);
    if (v == 0.0f) v = 0.5f;
  }
  return x;
}

}  // namespace fp4serve::model::test_support
