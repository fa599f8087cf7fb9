// SPDX-License-Identifier: Apache-2.0
#include "backends/cpu/kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "backends/cpu/kernels/simd.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels {

void softmax_rows(float* x, int64_t rows, int64_t n) {
  if (rows < 0 || n < 1) throw UsageError(fmt::format("softmax_rows: rows {} n {} (need rows >= 0, n >= 1)", rows, n));
  if (rows == 0) return;
  if (x == nullptr) throw UsageError("softmax_rows: null pointer");
#pragma omp parallel for schedule(static) if (rows * n >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * n;
    const float m = cpu::max_value(row, n);
    const float sum = cpu::exp_shifted_sum(row, n, m);
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) row[i] *= inv;
  }
}

double log_sum_exp(const float* x, int64_t n) {
  if (n < 1) throw UsageError(fmt::format("log_sum_exp: n {} (need n >= 1)", n));
  if (x == nullptr) throw UsageError("log_sum_exp: null pointer");
  const float m = cpu::max_value(x, n);
  return static_cast<double>(m) + std::log(cpu::exp_sum(x, n, m));
}

void top_k(const float* values, int64_t n, int64_t k, int32_t* indices, float* top_values) {
  if (n < 0 || k < 0 || k > n || n > INT32_MAX) {
    throw UsageError(fmt::format("top_k: k {} must be in [0, n] with n {} in [0, 2^31)", k, n));
  }
  if (k == 0) return;
  if (values == nullptr || indices == nullptr) throw UsageError("top_k: null pointer");
  // A strict total order: larger value first, NaN after every number, then lower index.
  auto before = [values](int32_t a, int32_t b) {
    const float va = values[a];
    const float vb = values[b];
    const bool na = std::isnan(va);
    const bool nb = std::isnan(vb);
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return a < b;
  };
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  for (int64_t i = 0; i < k; ++i) {
    indices[i] = order[i];
    if (top_values != nullptr) top_values[i] = values[order[i]];
  }
}

}  // namespace fp4serve::kernels
