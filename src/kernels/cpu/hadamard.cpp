// SPDX-License-Identifier: Apache-2.0
#include "kernels/hadamard.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "fp4serve/error.h"
#include "kernels/cpu/simd.h"

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

}  // namespace fp4serve::kernels
