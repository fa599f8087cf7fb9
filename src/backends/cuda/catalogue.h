// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's kernel catalogue (plan/kernel_catalogue.h), answered from the compute capability alone so
// that `--device sm80 … sm120` dry runs ask exactly what a GPU of that capability would be asked. Plain C++: it
// is built with or without nvcc. What it accepts is what backends/cuda uploads and runs: the CUDA backend's own
// checks read the same limits (kMaxAttentionHeadDim, kMaxTransformBlock, gpu_layout_supports).
#pragma once

#include <cstdint>
#include <string>

#include "plan/kernel_catalogue.h"

namespace fp4serve::backends::cuda {

/// The attention kernels (ops_attention.cu, ops_attention_decode.cu) keep one head in registers / shared memory.
inline constexpr int64_t kMaxAttentionHeadDim = 256;
/// fwht_blocks / rotate_blocks keep one block-diagonal slice in shared memory.
inline constexpr int64_t kMaxTransformBlock = 4096;

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
