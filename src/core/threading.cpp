// SPDX-License-Identifier: Apache-2.0
#include "core/threading.h"

#include <omp.h>

#include <string>

#include "fp4serve/error.h"

namespace fp4serve::core {
namespace {
// The runtime's default, captured before the first override so that set_num_threads(0) can restore it.
int default_threads() {
  static const int value = omp_get_max_threads();
  return value;
}
}  // namespace

void set_num_threads(int n) {
  if (n < 0) throw UsageError("set_num_threads: thread count must be >= 0 (0 = default), got " + std::to_string(n));
  const int base = default_threads();
  omp_set_num_threads(n == 0 ? base : n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace fp4serve::core
