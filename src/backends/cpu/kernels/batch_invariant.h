// SPDX-License-Identifier: Apache-2.0
// Batch-invariant mode of the CPU kernels: every row of a linear() call and every query row of an attention() call
// is computed with one fixed sequence of floating-point operations, whatever the number of rows in the call, which
// other rows share it, how a prompt was cut into chunks and how many threads run (`--batch-invariant`).
#pragma once

namespace fp4serve::kernels {

/// Switches batch-invariant mode on or off for the whole process (read at every linear() / attention() call; set
/// it before a step starts, not during one). Off by default. What it changes, and why each default path is not
/// invariant:
/// - linear() (linear.h): the default picks the kernel by m (the fused GEMV for m ≤ 4 / 8, the streaming or panel
///   GEMM above it; the AVX512-BF16 pair GEMV runs two accumulation chains per row for m ≤ 2 and one above), and
///   each kernel sums a row's products in its own order (the GEMV applies a block scale once per 16 / 32-column
///   partial sum, the panel GEMM multiplies decoded, scaled weights). Invariant: a layout with a fused GEMV runs
///   it for every m, its rows in chunks of one fixed size (4 or 8) inside each work item of output rows, so the
///   weights are still read once per call from memory, with one chain count for every chunk; ActivationPrecision::
///   Int8Decode is Int8 for every m (Fp32 where no SIMD int8 kernel exists); the other layouts run the panel GEMM
///   for every m (a sequential FMA chain over K per output element, blocks of K continuing the same chain).
/// - attention() (attention.h): the default splits a row's keys across threads when there are few (row, KV head)
///   items (flash-decoding: the split depends on the thread count) and runs blocks of rows (prefill) on the panel
///   micro-kernel but single rows (decode) as dot products. Invariant: no key split, and every call, one row or
///   many, runs the blocked kernel (its per-row arithmetic does not depend on the block: scores as FMA chains over
///   head_dim, the softmax over the row's own keys, P·V as an FMA chain over keys where the keys a row does not see
///   add exact zeros); targets without it (EMU128) run every row as the row-by-row kernel.
/// Norms, RoPE, activations, the embedding, MoE routing and the sampler are per row already.
void set_batch_invariant(bool on);

/// Whether batch-invariant mode is on.
bool batch_invariant();

}  // namespace fp4serve::kernels
