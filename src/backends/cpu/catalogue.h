// SPDX-License-Identifier: Apache-2.0
// The CPU's kernel catalogue (plan/kernel_catalogue.h): which CPU kernel runs each scheme on this host, named
// with the Highway target the GEMM dispatches to (AVX3, AVX2, NEON, SVE, …), or why none does. The CPU runs every
// weight-only and emulated scheme at any shape the plan accepts; it has no FP4 or FP8 matrix units, so the
// native W4A4 / W8A8 schemes are refused and the plan falls back to the next candidate.
#pragma once

#include <string>

#include "plan/kernel_catalogue.h"

namespace fp4serve::backends::cpu {

class CpuCatalogue final : public plan::KernelCatalogue {
 public:
  /// `device` is a CPU (plan::detect_cpu()); the kernel names read the GEMM's dispatch target at construction.
  explicit CpuCatalogue(plan::DeviceCaps device);

  const plan::DeviceCaps& device() const override { return device_; }
  /// "cpu-avx512", "cpu-avx2", "cpu-sve", "cpu-neon", "cpu-scalar": the instruction-set family from cpuid.
  std::string backend() const override;
  plan::KernelChoice linear(const plan::LinearQuery& query) const override;
  plan::KernelChoice attention(const plan::AttentionQuery& query) const override;
  plan::KernelChoice online_transform(const plan::TransformQuery& query) const override;

 private:
  plan::DeviceCaps device_;
  std::string target_;  ///< the Highway target linear() dispatches to, e.g. "AVX3_ZEN4"
};

}  // namespace fp4serve::backends::cpu
