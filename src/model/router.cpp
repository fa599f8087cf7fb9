// SPDX-License-Identifier: Apache-2.0
#include "model/router.h"

#include <fmt/format.h>

#include <vector>

#include "fp4serve/error.h"

namespace fp4serve::model {

void route(const RouterSettings& s, const float* logits, int64_t m, int32_t* experts, float* weights,
           const RouterMath& math) {
  if (m < 0 || (m > 0 && (logits == nullptr || experts == nullptr || weights == nullptr))) {
    throw UsageError("route: null pointer or negative token count");
  }
  if (math.softmax_rows == nullptr || math.top_k == nullptr) throw UsageError("route: no softmax / top-k given");
  if (s.top_k < 1 || s.top_k > s.num_experts) {
    throw UsageError(fmt::format("route: top_k {} outside 1 … {} experts", s.top_k, s.num_experts));
  }
  const int64_t e = s.num_experts;
  const int64_t k = s.top_k;
  std::vector<float> row(static_cast<size_t>(e));
  for (int64_t t = 0; t < m; ++t) {
    int32_t* idx = experts + t * k;
    float* w = weights + t * k;
    std::copy(logits + t * e, logits + (t + 1) * e, row.begin());
    switch (s.kind) {
      case RouterKind::SoftmaxTopK: {
        math.softmax_rows(row.data(), 1, e);
        math.top_k(row.data(), e, k, idx, w);
        if (s.renormalize) {
          float sum = 0.0f;
          for (int64_t j = 0; j < k; ++j) sum += w[j];
          for (int64_t j = 0; j < k; ++j) w[j] /= sum;
        }
        break;
      }
      case RouterKind::TopKSoftmax:
        math.top_k(row.data(), e, k, idx, w);
        math.softmax_rows(w, 1, k);
        break;
    }
    if (s.scaling != 1.0f) {
      for (int64_t j = 0; j < k; ++j) w[j] *= s.scaling;
    }
  }
}

}  // namespace fp4serve::model
