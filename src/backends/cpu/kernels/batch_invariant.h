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
///   Int8Decode is Int8 for every m (Fp32 where no SIMD int8 kernel exists), and Int8 (an FP4 or Int4 layer, the
///   latter also under auto) runs the int8 kernel, whose per-row sums do not depend on m; the other layouts run the panel GEMM
///   for every m (a sequential FMA chain over K per output element, blocks of K continuing the same chain).
/// - attention() (attention.h): the default splits a row's keys across threads when there are few (row, KV head)
///   items (flash-decoding: the split depends on the thread count and the rows of the call) and runs calls of two
///   or more rows (prefill chunks) blocked on the panel micro-kernel but single rows (decode) as dot products, so a
///   position's output depends on how its prompt was chunked. Invariant: every row by itself, as a decode step
///   runs it, and no key split: the work items are (row, KV head). (The blocked kernel's arithmetic per row does
///   not depend on the block either, but running a decode row through it packs the whole context's keys per step:
///   bench_ops, one thread, 9 heads / 3 KV heads / D 64 after 1023 keys, 140 against 62 µs.)
/// Norms, RoPE, activations, the embedding, MoE routing and the sampler are per row already.
void set_batch_invariant(bool on);

/// Whether batch-invariant mode is on.
bool batch_invariant();

/// Sets the mode for its lifetime and restores what it was (tests and benchmarks that compare both modes).
class BatchInvariantScope {
 public:
  explicit BatchInvariantScope(bool on) : was_(batch_invariant()) { set_batch_invariant(on); }
  ~BatchInvariantScope() { set_batch_invariant(was_); }
  BatchInvariantScope(const BatchInvariantScope&) = delete;
  BatchInvariantScope& operator=(const BatchInvariantScope&) = delete;

 private:
  bool was_;
};

}  // namespace fp4serve::kernels
