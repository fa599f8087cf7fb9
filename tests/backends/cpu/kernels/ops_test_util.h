// SPDX-License-Identifier: Apache-2.0
// Shared helpers for the kernel_ops tests: seeded inputs, NaN poisoning, and running a check once per SIMD
// target Highway compiled in (so the AVX-512, AVX2, SSE4, SSSE3 and scalar paths are each compared with the
// float64 references, not only the one the test machine would pick).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <hwy/targets.h>

namespace fp4serve::kernels::testing {

/// Uniform values in ±[lo, hi] with a random sign, so no element is zero.
inline std::vector<float> random_nonzero(size_t n, uint32_t seed, float lo = 0.05f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(lo, hi);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> v(n);
  for (float& x : v) x = sign(rng) ? mag(rng) : -mag(rng);
  return v;
}

inline std::vector<float> poisoned(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

/// Runs `fn(target_name)` once with dispatch forced to each compiled target the CPU supports, then restores
/// normal dispatch.
template <class Fn>
void for_each_simd_target(Fn fn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(std::string("SIMD target ") + hwy::TargetName(target));
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace fp4serve::kernels::testing
