// SPDX-License-Identifier: Apache-2.0
#include "core/threading.h"

#include <omp.h>

#include <atomic>

#include <string>

#include "fp4serve/error.h"

namespace fp4serve::core {
namespace {
// The runtime's default, captured before the first override so that set_num_threads(0) can restore it.
int default_threads() {
  static const int value = omp_get_max_threads();
  return value;
}
// OpenMP keeps the thread count per calling thread: a thread started later (the server's scheduler) would not
// see an override made on the main thread, so the engine's choice is also kept here, process-wide.
std::atomic<int> g_engine_threads{0};
}  // namespace

void set_num_threads(int n) {
  if (n < 0) throw UsageError("set_num_threads: thread count must be >= 0 (0 = default), got " + std::to_string(n));
  const int base = default_threads();
  g_engine_threads.store(n);
  omp_set_num_threads(n == 0 ? base : n);
}

int num_threads() { return omp_get_max_threads(); }

void adopt_engine_threads() {
  const int n = g_engine_threads.load();
  omp_set_num_threads(n == 0 ? default_threads() : n);
}

bool release_idle_threads() { return omp_pause_resource_all(omp_pause_soft) == 0; }

}  // namespace fp4serve::core
