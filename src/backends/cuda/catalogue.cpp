// SPDX-License-Identifier: Apache-2.0
#include "backends/cuda/catalogue.h"

#include <fmt/format.h>

#include <climits>
#include <utility>

#include "backends/cuda/kernels/gpu_layout.h"
#include "backends/cuda/kernels/limits.h"
#include "quant/block_format.h"

namespace fp4serve::backends::cuda {

using plan::KernelChoice;
using plan::SchemeId;

namespace {

// No CUDA kernel has run on a GPU in the project's sessions yet (docs/gpu.md): every answer says so,
// until a device run of scripts/device-check.sh passes for the kernel on that class of GPU.
constexpr bool kRunOnHardware = false;

KernelChoice runs(std::string kernel) { return KernelChoice::runs(std::move(kernel), kRunOnHardware); }

}  // namespace

CudaCatalogue::CudaCatalogue(plan::DeviceCaps device, bool kernels_built)
    : device_(std::move(device)), kernels_built_(kernels_built) {}

std::string CudaCatalogue::backend() const { return fmt::format("cuda-sm{}", device_.sm); }

std::string CudaCatalogue::unusable() const {
  if (!device_.runs_weight_only()) {
    return fmt::format("{} is below sm80: fp4serve's CUDA kernels need bf16 tensor cores (sm80 and later)",
                       device_.label());
  }
  if (!kernels_built_) {
    return fmt::format("this fp4serve was built without CUDA kernels (no nvcc at build time); {} runs nothing",
                       device_.label());
  }
  return {};
}

KernelChoice CudaCatalogue::linear(const plan::LinearQuery& q) const {
  if (std::string why = unusable(); !why.empty()) return KernelChoice::refused(std::move(why));
  const plan::SchemeTraits& t = plan::scheme_traits(q.scheme);
  if (t.weights == plan::WeightKind::Block) {
    const quant::BlockFormatTraits& f = quant::block_format_traits(*t.block);
    if (q.activation_order) {
      return KernelChoice::refused("the CUDA FP4 GEMM has no column permutation (weight_g_idx); use --device cpu");
    }
    if (!kernels::cuda::gpu_layout_supports(f.group_size)) {
      return KernelChoice::refused(fmt::format("{} groups of {} columns do not fit the GPU FP4 layout", f.name,
                                               f.group_size));
    }
  }
  // cuBLASLt's block-scaled FP4 (native_fp4.h) serves W4A4 where the device has FP4 matrix units for the format;
  // elsewhere W4A4 is emulated: activations fake-quantized on the GPU, then the weight-only MMA kernel.
  const bool native_fp4 = t.block && kernels::cuda::native_fp4_runs_on(*t.block, device_.sm);
  switch (q.scheme) {
    case SchemeId::Unquantized:
      if (q.role == checkpoint::ModuleRole::Embedding) return runs("embedding gather");
      if (q.out_features > INT_MAX || q.in_features > INT_MAX) {
        return KernelChoice::refused(fmt::format("[{}, {}] exceeds cuBLAS's int dimensions", q.out_features,
                                                 q.in_features));
      }
      return runs("cublas bf16 gemm");
    case SchemeId::W4A16Nvfp4: return runs("nvfp4 mma.sync gemm (bf16 act)");
    case SchemeId::W4A16Mxfp4: return runs("mxfp4 mma.sync gemm (bf16 act)");
    case SchemeId::W4A4Nvfp4Emulated:
      // The NVFP4 emulation is loaded as the producer's bf16 decompression (a dense weight, model/planned_weights.cpp)
      // with fake-quantized activations; the GPU's W4A4 path takes FP4 weights only.
      return KernelChoice::refused("the CUDA backend has no NVFP4 W4A4 emulation over bf16 weights yet "
                                   "(--activation-quant emulate runs NVFP4 on --device cpu)");
    case SchemeId::W4A4Mxfp4Emulated:
      return runs(native_fp4 ? "cublaslt block-scaled MXFP4 (native)" : "MXFP4 act fake-quant + mma.sync gemm");
    case SchemeId::W4A4Nvfp4:
    case SchemeId::W4A4Mxfp4: {
      if (native_fp4) return runs(fmt::format("cublaslt block-scaled {} (native)", quant::block_format_name(*t.block)));
      const std::string_view name = quant::block_format_name(*t.block);
      // The FP4 units of sm120 take NVFP4 scales only; fp4serve's MXFP4-activation kernel is for the sm100 family.
      if (kernels::cuda::native_fp4_runs_on(quant::BlockFormat::Nvfp4, device_.sm)) {
        return KernelChoice::refused(fmt::format("{} has FP4 matrix units but fp4serve has no {}-activation kernel "
                                                 "for it ({} W4A4 runs on the sm100 family only)", device_.label(),
                                                 name, name));
      }
      return KernelChoice::refused(fmt::format("{} has no FP4 matrix units (needs {})", device_.label(),
                                               kernels::cuda::native_fp4_runs_on(*t.block, 120) ? "sm100 or sm120"
                                                                                                : "the sm100 family"));
    }
    case SchemeId::W4A16Int4:
      return KernelChoice::refused("fp4serve has no CUDA int4 kernel yet (int4 layers run with --device cpu)");
    case SchemeId::W8A8Fp8:
      if (!device_.has_fp8_mma()) {
        return KernelChoice::refused(fmt::format("{} has no FP8 matrix units (needs sm89+)", device_.label()));
      }
      [[fallthrough]];
    case SchemeId::W8A16Fp8:
      return KernelChoice::refused("fp4serve has no CUDA FP8 kernel yet (FP8 layers run with --device cpu)");
  }
  return KernelChoice::refused("unknown scheme");
}

KernelChoice CudaCatalogue::attention(const plan::AttentionQuery& q) const {
  if (std::string why = unusable(); !why.empty()) return KernelChoice::refused(std::move(why));
  if (q.head_dim > kernels::cuda::kMaxAttentionHeadDim) {
    return KernelChoice::refused(fmt::format("the CUDA attention kernels take head_dim up to {}, the model has {}",
                                             kernels::cuda::kMaxAttentionHeadDim, q.head_dim));
  }
  return runs("gqa attention, flash-decoding splits");
}

KernelChoice CudaCatalogue::online_transform(const plan::TransformQuery& q) const {
  if (std::string why = unusable(); !why.empty()) return KernelChoice::refused(std::move(why));
  if (q.block > kernels::cuda::kMaxTransformBlock) {
    return KernelChoice::refused(fmt::format("online transform of block {}: the GPU transform kernels take blocks up "
                                             "to {}", q.block, kernels::cuda::kMaxTransformBlock));
  }
  return runs(fmt::format("block rotation b{}", q.block));
}

}  // namespace fp4serve::backends::cuda
