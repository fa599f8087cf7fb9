// SPDX-License-Identifier: Apache-2.0
// What the CUDA kernels can take, in one plain header (no CUDA headers: it compiles in every build). The kernels,
// the CUDA backend and the CUDA kernel catalogue (backends/cuda/catalogue.h) all read these, so `explain` refuses
// exactly what the GPU would refuse at load.
#pragma once

#include <cstdint>

#include "quant/block_format.h"

namespace fp4serve::kernels::cuda {

/// The largest head_dim the attention kernels handle (each lane of a warp holds head_dim/32 accumulators).
inline constexpr int64_t kMaxAttentionHeadDim = 256;

/// The largest online-transform block of fwht_blocks / rotate_blocks (one block-diagonal slice in shared memory).
inline constexpr int64_t kMaxTransformBlock = 4096;

/// Whether the native W4A4 path (cuBLASLt block-scaled FP4, native_fp4.h) runs `format` on compute capability
/// `sm` (× 10): NVFP4 on the sm100 and sm120 families, MXFP4 on the sm100 family only (fp4serve's sm120 path takes
/// NVFP4 scales only; docs/SCHEMES.md). Elsewhere W4A4 layers run the emulation.
constexpr bool native_fp4_runs_on(quant::BlockFormat format, int sm) {
  switch (format) {
    case quant::BlockFormat::Nvfp4: return sm >= 100;
    case quant::BlockFormat::Mxfp4: return sm >= 100 && sm < 120;
  }
  return false;
}

}  // namespace fp4serve::kernels::cuda
