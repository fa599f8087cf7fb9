// SPDX-License-Identifier: Apache-2.0
// RMS normalization on CPU (Highway inner loops, cpu/norm.cpp).
#pragma once

#include <cstdint>

namespace fp4serve::kernels {

/// HF LlamaRMSNorm (transformers `modeling_llama.py`): out = weight · (x · 1/√(mean(x²) + eps)), in fp32.
/// x: [rows, dim] f32; weight: [dim] f32; out: [rows, dim] f32, may alias x. rows ≥ 0, dim ≥ 1, eps ≥ 0.
/// Rows run in parallel (OpenMP) when there are several. Throws UsageError on a null pointer or bad size.
void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out);

}  // namespace fp4serve::kernels
