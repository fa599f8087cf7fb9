// SPDX-License-Identifier: Apache-2.0
#include "backends/cpu/kernels/hadamard.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "backends/cpu/kernels/linear.h"
#include "backends/cpu/kernels/simd.h"
#include "backends/cpu/prepare/repack.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels {

void fwht_blocks(float* x, int64_t rows, int64_t dim, int64_t block) {
  const bool pow2 = block >= 2 && block <= (int64_t{1} << 15) && (block & (block - 1)) == 0;
  if (!pow2 || rows < 0 || dim < 1 || dim % block != 0) {
    throw UsageError(fmt::format(
        "fwht_blocks: block {} must be a power of two in [2, 32768] dividing dim {}; rows {} >= 0", block, dim, rows));
  }
  if (rows == 0) return;
  if (x == nullptr) throw UsageError("fwht_blocks: null pointer");
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  // One 4096-wide row costs ~1 µs; thread only batches big enough to amortize the fork/join.
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 17))
  for (int64_t r = 0; r < rows; ++r) cpu::fwht(x + r * dim, dim, block, scale);
}

void rotate_blocks(float* x, int64_t rows, int64_t dim, const float* matrix, int64_t block) {
  if (block < 1 || rows < 0 || dim < 1 || dim % block != 0) {
    throw UsageError(fmt::format("rotate_blocks: block {} must be >= 1 and divide dim {}; rows {} >= 0", block, dim, rows));
  }
  if (rows == 0) return;
  if (x == nullptr || matrix == nullptr) throw UsageError("rotate_blocks: null pointer");
#pragma omp parallel if (rows > 1)
  {
    std::vector<float> acc(static_cast<size_t>(block));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) cpu::rotate_blocks(x + r * dim, dim, matrix, block, acc.data());
  }
}

KroneckerHadamardKernel prepare_kronecker_hadamard(const quant::KroneckerHadamardSteps& steps) {
  KroneckerHadamardKernel kernel;
  kernel.steps = &steps;
  const size_t want = steps.k > 1 ? static_cast<size_t>(steps.k * steps.k) : 0;
  if (steps.mix.size() != want) {
    throw UsageError(fmt::format("prepare_kronecker_hadamard: a mixing matrix of {} values for k = {}",
                                 steps.mix.size(), steps.k));
  }
  if (steps.k > 1) {
    const core::TensorView view{core::DType::F32, {steps.k, steps.k}, std::as_bytes(std::span<const float>(steps.mix))};
    kernel.mix = std::make_shared<const prepare::PreparedLinear>(prepare::prepare_dense(view, "kronecker-hadamard factor"));
  }
  return kernel;
}

void kronecker_hadamard_blocks(const KroneckerHadamardKernel& kernel, float* x, int64_t rows, int64_t dim) {
  if (kernel.steps == nullptr) throw UsageError("kronecker_hadamard_blocks: no steps");
  const quant::KroneckerHadamardSteps& t = *kernel.steps;
  const int64_t n = t.n, p = t.p, k = t.k;
  if (n < 2 || p < 2 || k < 1 || n != p * k || rows < 0 || dim % n != 0 ||
      t.in_index.size() != static_cast<size_t>(n) || (k > 1) != (kernel.mix != nullptr)) {
    throw UsageError(fmt::format("kronecker_hadamard_blocks: n {} = k {} · p {} (mix {}) on rows {} of width {}", n, k,
                                 p, kernel.mix != nullptr, rows, dim));
  }
  if (rows == 0) return;
  if (x == nullptr) throw UsageError("kronecker_hadamard_blocks: null pointer");
  const int64_t vectors = rows * (dim / n);
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 15) / n);
  std::vector<float> f(static_cast<size_t>(std::min(chunk, vectors) * n));
  std::vector<float> ft(k > 1 ? f.size() : 0), z(k > 1 ? f.size() : 0);
  const int32_t* in_index = t.in_index.data();
  const float* in_sign = t.in_sign.data();
  const int32_t* out_index = t.out_index.data();
  const float* out_scale = t.out_scale.data();
  for (int64_t v0 = 0; v0 < vectors; v0 += chunk) {
    const int64_t c = std::min(chunk, vectors - v0);
    float* xv = x + v0 * n;
    const bool par = c * n >= (int64_t{1} << 14);
#pragma omp parallel for schedule(static) if (par)
    for (int64_t v = 0; v < c; ++v) {
      const float* src = xv + v * n;
      float* dst = f.data() + v * n;
      for (int64_t q = 0; q < n; ++q) dst[q] = src[in_index[q]] * in_sign[q];
      cpu::fwht(dst, n, p, 1.0f);
    }
    const float* out = f.data();
    if (k > 1) {
      // f[v][a][h] → ft[v][h][a]: the p FWHT outputs of one vector become p rows of the k-mixing GEMM.
#pragma omp parallel for schedule(static) if (par)
      for (int64_t v = 0; v < c; ++v) {
        const float* src = f.data() + v * n;
        float* dst = ft.data() + v * n;
        for (int64_t a = 0; a < k; ++a) {
          for (int64_t h = 0; h < p; ++h) dst[h * k + a] = src[a * p + h];
        }
      }
      linear(*kernel.mix, ft.data(), c * p, z.data());
      out = z.data();
    }
#pragma omp parallel for schedule(static) if (par)
    for (int64_t v = 0; v < c; ++v) {
      const float* src = out + v * n;
      float* dst = xv + v * n;
      for (int64_t j = 0; j < n; ++j) dst[j] = src[out_index[j]] * out_scale[j];
    }
  }
}

}  // namespace fp4serve::kernels
