// SPDX-License-Identifier: Apache-2.0
// Launch helpers shared by the ops_*.cu files: grid sizing and host-side argument checks (launch failures are
// checked with FP4SERVE_CUDA_CHECK_LAUNCH, cuda_check.h).
#pragma once

#include <cstdint>
#include <string>

#include "fp4serve/error.h"

namespace fp4serve::kernels::cuda::detail {

/// Blocks of `threads` covering n elements, capped so that grid-stride loops do the rest.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

inline void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw UsageError(std::string("CUDA ") + op + ": " + what);
}

}  // namespace fp4serve::kernels::cuda::detail
