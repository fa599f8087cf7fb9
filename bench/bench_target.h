// SPDX-License-Identifier: Apache-2.0
// FP4SERVE_BENCH_TARGET=AVX2 (or AVX3, EMU128, NEON, …) pins the Highway target of the kernels a benchmark
// binary runs, e.g. to measure the AVX2 kernels on an AVX-512 machine. Shared by bench_gemm_fp4 and bench_ops.
#pragma once

#include <hwy/targets.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fp4serve::bench {

/// Applies FP4SERVE_BENCH_TARGET when set. Returns false (after a message on stderr) when it names no compiled
/// target this CPU supports; true otherwise.
inline bool pin_target_from_env() {
  const char* want = std::getenv("FP4SERVE_BENCH_TARGET");
  if (want == nullptr) return true;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    if (std::strcmp(hwy::TargetName(t), want) == 0) {
      hwy::SetSupportedTargetsForTest(t);
      return true;
    }
  }
  std::fprintf(stderr, "FP4SERVE_BENCH_TARGET=%s is not a compiled target supported by this CPU\n", want);
  return false;
}

}  // namespace fp4serve::bench
