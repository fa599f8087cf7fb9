// SPDX-License-Identifier: Apache-2.0
#include "backends/cpu/kernels/activation.h"

#include <fmt/format.h>

#include "backends/cpu/kernels/simd.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels {
namespace {

void check_gated(const char* op, const float* x, int64_t m, int64_t inter, const float* out) {
  if (m < 0 || inter < 0) throw UsageError(fmt::format("{}: m {} inter {} must be >= 0", op, m, inter));
  if (m > 0 && inter > 0 && (x == nullptr || out == nullptr)) throw UsageError(fmt::format("{}: null pointer", op));
}

// Runs `row(gate, up, inter, out)` over the m rows, in parallel when the batch is large (prefill, MoE).
template <class RowFn>
void for_each_row(const float* x, int64_t m, int64_t inter, float* out, RowFn row) {
#pragma omp parallel for schedule(static) if (m * inter >= (1 << 16))
  for (int64_t r = 0; r < m; ++r) row(x + r * 2 * inter, x + r * 2 * inter + inter, inter, out + r * inter);
}

}  // namespace

void silu_and_mul(const float* x, int64_t m, int64_t inter, float* out) {
  check_gated("silu_and_mul", x, m, inter, out);
  for_each_row(x, m, inter, out, cpu::silu_mul);
}

void swiglu_oai_and_mul(const float* x, int64_t m, int64_t inter, float alpha, float limit, float* out) {
  check_gated("swiglu_oai_and_mul", x, m, inter, out);
  if (!(limit > 0)) throw UsageError(fmt::format("swiglu_oai_and_mul: limit must be > 0, found {}", limit));
  for_each_row(x, m, inter, out, [alpha, limit](const float* g, const float* u, int64_t n, float* o) {
    cpu::swiglu_oai_mul(g, u, n, alpha, limit, o);
  });
}

}  // namespace fp4serve::kernels
