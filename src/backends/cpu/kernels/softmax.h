// SPDX-License-Identifier: Apache-2.0
// Row softmax and top-k selection on CPU (cpu/softmax.cpp), used by MoE routers and samplers.
#pragma once

#include <cstdint>

namespace fp4serve::kernels {

/// In-place softmax of each row, max-subtracted (exp(x − max) / Σ exp(x − max)) in fp32.
/// x: [rows, n] f32; n ≥ 1. A row whose entries are all −inf becomes NaN (as torch.softmax does).
/// Throws UsageError on a null pointer or bad size.
void softmax_rows(float* x, int64_t rows, int64_t n);

/// log Σ_i exp(x[i]) as max + log Σ exp(x[i] − max): exp in fp32, lane sums of 1024-element blocks in fp32 added
/// in float64, the log in float64.
/// Absolute error ≲ 5e-7 (n = 49157, a spread of 60 in the tests), so log-probabilities x[i] − log_sum_exp are
/// that close however small the probability (no exp of the target is taken, nothing underflows). x: [n] finite, n ≥ 1.
/// Throws UsageError on a null pointer or n < 1.
double log_sum_exp(const float* x, int64_t n);

/// The k largest of values[0..n), in descending order, into indices[0..k) and top_values[0..k)
/// (top_values may be nullptr). Ties go to the lower index first; NaN ranks below every number, −inf
/// included. (torch.topk leaves the order of ties unspecified; this rule makes routing reproducible.)
/// values: [n]; 0 ≤ k ≤ n. Throws UsageError when k is out of range or a pointer is null.
void top_k(const float* values, int64_t n, int64_t k, int32_t* indices, float* top_values);

}  // namespace fp4serve::kernels
