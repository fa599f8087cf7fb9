// SPDX-License-Identifier: Apache-2.0
// The RoPE rotation (the table: model/rope_table.cpp).
#include "backends/cpu/kernels/rope.h"

#include <fmt/format.h>

#include "fp4serve/error.h"

namespace fp4serve::kernels {

void apply_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const int64_t* positions,
                const RopeTable& table, RopeLayout layout) {
  const int64_t rot = table.rotary_dim;
  if (tokens < 0 || heads < 0 || rot > head_dim) {
    throw UsageError(fmt::format("apply_rope: tokens {} heads {} head_dim {} with rotary_dim {} is invalid", tokens,
                                 heads, head_dim, rot));
  }
  if (tokens == 0 || heads == 0) return;
  if (x == nullptr || positions == nullptr || table.cos == nullptr || table.sin == nullptr) {
    throw UsageError("apply_rope: null pointer");
  }
  for (int64_t t = 0; t < tokens; ++t) {
    if (positions[t] < 0 || positions[t] >= table.max_positions) {
      throw UsageError(fmt::format("apply_rope: token {} has position {}, outside the cache's [0, {})", t,
                                   positions[t], table.max_positions));
    }
  }
  const int64_t half = rot / 2;
#pragma omp parallel for schedule(static) if (tokens * heads * rot > (1 << 16))
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = table.cos + positions[t] * half;
    const float* s = table.sin + positions[t] * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      switch (layout) {
        case RopeLayout::NeoX:
          for (int64_t i = 0; i < half; ++i) {
            const float a = v[i];
            const float b = v[i + half];
            v[i] = a * c[i] - b * s[i];
            v[i + half] = b * c[i] + a * s[i];
          }
          break;
        case RopeLayout::GptJ:
          for (int64_t i = 0; i < half; ++i) {
            const float a = v[2 * i];
            const float b = v[2 * i + 1];
            v[2 * i] = a * c[i] - b * s[i];
            v[2 * i + 1] = b * c[i] + a * s[i];
          }
          break;
      }
    }
  }
}

}  // namespace fp4serve::kernels
