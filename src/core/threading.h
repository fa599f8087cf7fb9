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

/// Ends the calling thread's idle OpenMP workers (omp_pause_resource_all), for a thread that hands the kernels to
/// another one (the server's scheduler). Why: libgomp spins its idle workers only while it manages no more threads
/// than there are CPUs; the loading thread's idle team would otherwise push a 2-CPU server past that, and every
/// parallel region of every step would then pay a futex sleep and wake-up (docs/performance.md "Threads").
/// Call it outside any parallel region; the caller's next parallel region starts a new team. Returns false where
/// the runtime declined. (libgomp ends the threads; LLVM's libomp would only put them to sleep.)
bool release_idle_threads();

}  // namespace fp4serve::core
