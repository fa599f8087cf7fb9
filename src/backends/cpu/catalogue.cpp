// SPDX-License-Identifier: Apache-2.0
#include "backends/cpu/catalogue.h"

#include <fmt/format.h>

#include <utility>

#include "backends/cpu/kernels/linear.h"

namespace fp4serve::backends::cpu {

using plan::KernelChoice;
using plan::SchemeId;

CpuCatalogue::CpuCatalogue(plan::DeviceCaps device)
    : device_(std::move(device)), target_(kernels::gemm_target_name()) {}

std::string CpuCatalogue::backend() const {
  const plan::CpuFeatures& f = device_.cpu;
  if (f.avx512f) return "cpu-avx512";
  if (f.avx2) return "cpu-avx2";
  if (f.sve) return "cpu-sve";
  if (f.neon) return "cpu-neon";
  return "cpu-scalar";
}

KernelChoice CpuCatalogue::linear(const plan::LinearQuery& q) const {
  // Names follow kernels/linear.h: FP4 and int4 decode in registers (fused GEMV for decode rows, a decoded row
  // panel and a register-blocked micro-kernel for prefill); the activation precision is a load option.
  const auto on_target = [&](std::string_view what) { return KernelChoice::runs(fmt::format("{} [{}]", what, target_)); };
  switch (q.scheme) {
    case SchemeId::W4A16Nvfp4: return on_target("nvfp4 gemv/panel-gemm");
    case SchemeId::W4A16Mxfp4: return on_target("mxfp4 gemv/panel-gemm");
    case SchemeId::W4A4Nvfp4Emulated: return on_target("nvfp4 act fake-quant + nvfp4 gemm");
    case SchemeId::W4A4Mxfp4Emulated: return on_target("mxfp4 act fake-quant + mxfp4 gemm");
    case SchemeId::W4A16Int4: return on_target("int4 gemv/panel-gemm");
    case SchemeId::W8A16Fp8: return on_target("fp8 gemm");
    case SchemeId::Unquantized:
      return q.role == checkpoint::ModuleRole::Embedding ? KernelChoice::runs("embedding gather")
                                                         : on_target("dense gemm");
    case SchemeId::W4A4Nvfp4:
    case SchemeId::W4A4Mxfp4:
      return KernelChoice::refused(fmt::format("{} has no FP4 matrix units (W4A4 runs on the CPU weight-only or, with "
                                               "--activation-quant emulate, emulated)", backend()));
    case SchemeId::W8A8Fp8:
      return KernelChoice::refused(fmt::format("{} has no FP8 matrix units (W8A8 runs on the CPU as W8A16)", backend()));
  }
  return KernelChoice::refused("unknown scheme");
}

KernelChoice CpuCatalogue::attention(const plan::AttentionQuery&) const {
  return KernelChoice::runs(fmt::format("gqa attention, online softmax [{}]", target_));
}

KernelChoice CpuCatalogue::online_transform(const plan::TransformQuery& q) const {
  // model::TransformCache picks FWHT, Kronecker-Hadamard or a dense rotation from the matrix; all run here.
  return KernelChoice::runs(fmt::format("block rotation b{}", q.block));
}

}  // namespace fp4serve::backends::cpu
