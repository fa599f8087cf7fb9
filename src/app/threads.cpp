// SPDX-License-Identifier: Apache-2.0
#include "app/threads.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "core/threading.h"

namespace fp4serve::app {
namespace {
// Set together with OMP_WAIT_POLICY by default_to_passive_wait, so the summary can tell fp4serve's default from a
// policy the user chose.
constexpr const char* kDefaulted = "FP4SERVE_OMP_WAIT_DEFAULTED";

bool set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}
}  // namespace

void default_to_passive_wait(char** argv) {
  if (set("OMP_WAIT_POLICY") || set("GOMP_SPINCOUNT")) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  setenv(kDefaulted, "1", 1);
  execv("/proc/self/exe", argv);
  // Only reached when execv failed (no /proc): carry on with the runtime's default waiting.
  unsetenv("OMP_WAIT_POLICY");
  unsetenv(kDefaulted);
}

std::string thread_summary() {
  const int n = core::num_threads();
  std::string policy;
  if (set(kDefaulted)) {
    policy = "passive wait";
  } else if (set("OMP_WAIT_POLICY")) {
    policy = fmt::format("OMP_WAIT_POLICY={}", std::getenv("OMP_WAIT_POLICY"));
  } else if (set("GOMP_SPINCOUNT")) {
    policy = fmt::format("GOMP_SPINCOUNT={}", std::getenv("GOMP_SPINCOUNT"));
  } else {
    policy = "OpenMP default wait";
  }
  return fmt::format("{} thread{}, {}", n, n == 1 ? "" : "s", policy);
}

}  // namespace fp4serve::app
