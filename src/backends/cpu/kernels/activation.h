// SPDX-License-Identifier: Apache-2.0
// Gated MLP activations on CPU (Highway inner loops, cpu/activation.cpp). All in fp32.
// Both read x as [m, 2·inter] with the gate in the first half of each row and the up projection in
// the second (vLLM's SiluAndMul convention). GPT-OSS checkpoints interleave gate/up rows (FORMATS.md §5); the
// weight repack must de-interleave them so the fused gate_up GEMM writes this layout.
// Each throws UsageError on a null pointer or a negative size; `out` must not alias `x`.
#pragma once

#include <cstdint>

namespace fp4serve::kernels {

/// out[r, i] = silu(g) · u with g = x[r, i], u = x[r, inter + i], silu(g) = g / (1 + e^−g).
/// x: [m, 2·inter]; out: [m, inter].
void silu_and_mul(const float* x, int64_t m, int64_t inter, float* out);

/// GPT-OSS "swiglu-oai" (HF `GptOssExperts`, FORMATS.md §5): g = min(gate, limit) (no lower clamp),
/// u = clamp(up, −limit, limit), out = (u + 1) · g · sigmoid(alpha · g). GPT-OSS uses alpha = 1.702,
/// limit = config "swiglu_limit" = 7. x: [m, 2·inter] (gate | up halves); out: [m, inter].
void swiglu_oai_and_mul(const float* x, int64_t m, int64_t inter, float alpha, float limit, float* out);

}  // namespace fp4serve::kernels
