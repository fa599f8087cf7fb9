// SPDX-License-Identifier: Apache-2.0
#include "app/threads.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "core/threading.h"

namespace fp4serve::app {
namespace {
// Set with the chosen variable by set_default_wait_policy ("passive" / "spin"), so the summary can tell
// fp4serve's default from a policy the user chose.
constexpr const char* kDefaulted = "FP4SERVE_OMP_WAIT_DEFAULTED";

bool set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

int sample_runnable() {
  std::ifstream in("/proc/loadavg");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return runnable_tasks(text);
}
}  // namespace

WaitDefault choose_wait_default(std::span<const int> other_runnable, int cpus) {
  if (other_runnable.empty() || cpus < 1) return WaitDefault::Passive;
  if (std::any_of(other_runnable.begin(), other_runnable.end(), [](int n) { return n < 0; })) return WaitDefault::Passive;
  // The fewest: a task that is runnable in one sample only (a pipeline's next process starting) is no competition.
  const int fewest = *std::min_element(other_runnable.begin(), other_runnable.end());
  return fewest <= cpus / 16 ? WaitDefault::ShortSpin : WaitDefault::Passive;
}

int runnable_tasks(std::string_view loadavg) {
  // "0.68 1.63 1.86 3/412 12345": three averages, then runnable/total, then the last PID.
  size_t at = 0;
  for (int field = 0; field < 3; ++field) {
    at = loadavg.find(' ', at);
    if (at == std::string_view::npos) return -1;
    ++at;
  }
  const size_t slash = loadavg.find('/', at);
  if (slash == std::string_view::npos || slash == at) return -1;
  int n = -1;
  const auto [end, ec] = std::from_chars(loadavg.data() + at, loadavg.data() + slash, n);
  return ec == std::errc() && end == loadavg.data() + slash && n >= 0 ? n : -1;
}

void set_default_wait_policy(char** argv) {
  if (set("OMP_WAIT_POLICY") || set("GOMP_SPINCOUNT")) return;
  std::vector<int> others;
  for (int i = 0; i < 4; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const int n = sample_runnable();
    if (n < 1) break;  // unreadable: no sample, hence passive
    others.push_back(n - 1);
  }
  const auto cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  switch (choose_wait_default(others, cpus)) {
    case WaitDefault::ShortSpin:
      setenv("GOMP_SPINCOUNT", std::to_string(kShortSpinCount).c_str(), 1);
      setenv(kDefaulted, "spin", 1);
      break;
    case WaitDefault::Passive:
      setenv("OMP_WAIT_POLICY", "passive", 1);
      setenv(kDefaulted, "passive", 1);
      break;
  }
  execv("/proc/self/exe", argv);
  // Only reached when execv failed (no /proc): carry on with the runtime's default waiting.
  unsetenv("OMP_WAIT_POLICY");
  unsetenv("GOMP_SPINCOUNT");
  unsetenv(kDefaulted);
}

std::string thread_summary() {
  const int n = core::num_threads();
  std::string policy;
  if (set(kDefaulted)) {
    policy = std::string_view(std::getenv(kDefaulted)) == "spin" ? "short spin wait" : "passive wait";
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
