// SPDX-License-Identifier: Apache-2.0
// Declarations shared by the GEMM translation units (not a public API): the scalar element decoder and
// epilogue that both the reference and the SIMD kernels use, and the per-target entry point.
#pragma once

#include <cstdint>

#include "prepare/prepared_linear.h"

namespace fp4serve::kernels {

/// W[n, k] in PREPARED column order without the NVFP4 global scale (block scales, int4 offsets included).
float decode_weight(const prepare::PreparedLinear& w, int64_t n, int64_t k);

/// acc (Σ x·w for output row n) → final value: NVFP4 global scale, then bias.
float apply_epilogue(const prepare::PreparedLinear& w, int64_t n, float acc);

/// Scalar GEMM on x already in prepared column order (k_perm applied): the fallback target's kernel.
void reference_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

/// The fused small-m NVFP4/MXFP4 GEMV (gemm_gemv.cpp) for the best supported target, x in prepared column
/// order. Returns false (and writes nothing) when the layout or target has no fused path or m is outside
/// [1, gemv_max_rows()].
bool gemv_dispatch(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

/// Largest m the fused GEMV serves on the current target: 4 (AVX2, NEON, SVE), 8 (AVX-512), 0 (EMU128).
int64_t gemv_max_rows();

/// The SIMD GEMM for the best supported target, x in prepared column order (defined in gemm_simd.cpp).
void gemm_dispatch(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y);

}  // namespace fp4serve::kernels
