// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's kernel catalogue (plan/kernel_catalogue.h), answered from the compute capability alone so
// that `--device sm80 … sm120` dry runs ask exactly what a GPU of that capability would be asked. Plain C++: it
// is built with or without nvcc. What it accepts is what backends/cuda uploads and runs: the kernels and the CUDA
// backend's own checks read the same limits (kernels/limits.h: kMaxAttentionHeadDim, kMaxTransformBlock,
// native_fp4_runs_on; kernels/gpu_layout.h: gpu_layout_supports).
#pragma once

#include <cstdint>
#include <string>

#include "plan/kernel_catalogue.h"

namespace fp4serve::backends::cuda {

class CudaCatalogue final : public plan::KernelCatalogue {
 public:
  /// `device` is a CUDA device (detected, or a dry run). `kernels_built`: this build has the CUDA kernels; a
  /// detected GPU in a build without them runs nothing (dry runs answer for a CUDA build and pass true).
  CudaCatalogue(plan::DeviceCaps device, bool kernels_built);

  const plan::DeviceCaps& device() const override { return device_; }
  /// "cuda-sm90"
  std::string backend() const override;
  plan::KernelChoice linear(const plan::LinearQuery& query) const override;
  plan::KernelChoice attention(const plan::AttentionQuery& query) const override;
  plan::KernelChoice online_transform(const plan::TransformQuery& query) const override;

 private:
  /// Why nothing runs on this device at all ("" when kernels can run): below sm80, or no kernels in this build.
  std::string unusable() const;

  plan::DeviceCaps device_;
  bool kernels_built_;
};

}  // namespace fp4serve::backends::cuda
