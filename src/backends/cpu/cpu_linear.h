// SPDX-License-Identifier: Apache-2.0
// The CPU backend's linear groups and online transforms: a model::LinearGroup run on the CPU GEMM kernels
// (backends/cpu/kernels/linear.h), its parts' online input / output transforms and the attention transforms on the
// Hadamard kernels (backends/cpu/kernels/hadamard.h). model/ describes both (linear_group.h, online_transform.h); this
// is how the CPU computes them.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cpu/kernels/linear.h"
#include "model/linear_group.h"
#include "model/online_transform.h"

namespace fp4serve::backends::cpu {

/// The CPU kernels' activation emulation of a part's (model::ActivationEmulation).
kernels::ActivationEmulation activation_emulation_of(model::ActivationEmulation emulation);

/// x[rows, dim] f32, in place: each b-wide slice of every row ← slice · M̂ (kernels::fwht_blocks, rotate_blocks or
/// kronecker_hadamard_blocks by t.kernel()). Throws UsageError when b does not divide dim.
void apply_transform(const model::OnlineTransform& t, float* x, int64_t rows, int64_t dim);
/// The same on the columns [0, width) of rows `stride` floats apart (one shard's slice of a concatenated output,
/// e.g. k of q|k|v). Throws UsageError when b does not divide width or width > stride.
void apply_transform_strided(const model::OnlineTransform& t, float* x, int64_t rows, int64_t width, int64_t stride);

/// y[m, out_features] = concat over parts of U_part(T_part(x[m, K]) · W_partᵀ (+ bias_part)), T_part the part's
/// online input transform and U_part its output transforms per slice (identity where absent). `scratch` is reused
/// between calls to avoid allocations when there is more than one part; x is never modified (a transformed copy
/// lives in a per-thread buffer).
void linear_forward(const model::LinearGroup& group, const float* x, int64_t m, float* y, std::vector<float>& scratch);

}  // namespace fp4serve::backends::cpu
