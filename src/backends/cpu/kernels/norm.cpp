// SPDX-License-Identifier: Apache-2.0
#include "backends/cpu/kernels/norm.h"

#include <cmath>

#include <fmt/format.h>

#include "backends/cpu/kernels/simd.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels {

void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out) {
  if (rows < 0 || dim < 1 || !(eps >= 0)) {
    throw UsageError(fmt::format("rms_norm: rows {} dim {} eps {} (need rows >= 0, dim >= 1, eps >= 0)", rows, dim, eps));
  }
  if (rows == 0) return;
  if (x == nullptr || weight == nullptr || out == nullptr) throw UsageError("rms_norm: null pointer");
  // A row of 4096 is ~1 µs; only prefill batches are worth the fork/join.
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float mean_sq = cpu::sum_squares(xr, dim) / static_cast<float>(dim);
    // HF: hidden * torch.rsqrt(variance + eps), all fp32.
    const float inv_rms = 1.0f / std::sqrt(mean_sq + eps);
    cpu::scale_by_weight(xr, weight, inv_rms, dim, out + r * dim);
  }
}

}  // namespace fp4serve::kernels
