// SPDX-License-Identifier: Apache-2.0
// The engine's one thread pool: OpenMP underneath, one thread count for every parallel kernel.
#pragma once

namespace fp4serve::core {

/// Sets the number of threads every later parallel kernel uses. n ≥ 1; n = 0 restores the default (the
/// OpenMP runtime's choice, normally one per online CPU or OMP_NUM_THREADS). Throws UsageError for n < 0.
/// Call it from the main thread, not from inside a parallel region.
void set_num_threads(int n);

/// The thread count parallel kernels use now (≥ 1).
int num_threads();

/// Applies the engine's thread count (the last set_num_threads, process-wide) to the calling thread. OpenMP keeps
/// the count per thread, so a thread that runs kernels and was started after set_num_threads calls this first.
void adopt_engine_threads();

}  // namespace fp4serve::core
