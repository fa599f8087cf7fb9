// SPDX-License-Identifier: Apache-2.0
// Token embedding lookup on CPU (cpu/embedding.cpp).
#pragma once

#include <cstdint>

#include "core/tensor_view.h"

namespace fp4serve::kernels {

/// out[i, :] = table[ids[i], :] widened to f32 (BF16 and F16 exactly; F32 copied).
/// table: [vocab, dim], dtype BF16, F16 or F32 (read unaligned-safe from the mapped shard); ids: [count];
/// out: [count, dim] f32. Throws UsageError naming the position and id when an id is outside [0, vocab), and
/// UnsupportedError for any other table dtype or a table that is not 2-D / whose byte count does not match.
void embedding_gather(const core::TensorView& table, const int32_t* ids, int64_t count, float* out);

}  // namespace fp4serve::kernels
