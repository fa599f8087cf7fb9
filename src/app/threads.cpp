// SPDX-License-Identifier: Apache-2.0
#include "app/threads.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
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

std::string read_text(const char* path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The CPUs of this process's affinity mask (what libgomp sizes its team by); online CPUs if that fails.
int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

bool parse_int(std::string_view text, int64_t& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}
}  // namespace

int cgroup_cpu_limit(std::string_view cpu_max) {
  while (!cpu_max.empty() && (cpu_max.back() == '\n' || cpu_max.back() == ' ')) cpu_max.remove_suffix(1);
  const size_t space = cpu_max.find(' ');
  if (space == std::string_view::npos) return 0;
  const std::string_view quota = cpu_max.substr(0, space), period = cpu_max.substr(space + 1);
  int64_t q = 0, p = 0;
  if (quota == "max" || !parse_int(quota, q) || !parse_int(period, p) || q <= 0 || p <= 0) return 0;
  return static_cast<int>(std::max<int64_t>(1, q / p));
}

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
  int64_t n = -1;
  if (!parse_int(loadavg.substr(at, slash - at), n) || n < 0 || n > std::numeric_limits<int>::max()) return -1;
  return static_cast<int>(n);
}

void set_default_wait_policy(char** argv) {
  if (set("OMP_WAIT_POLICY") || set("GOMP_SPINCOUNT")) return;
  const int cpus = affinity_cpus();
  const int quota = cgroup_cpu_limit(read_text("/sys/fs/cgroup/cpu.max"));
  std::vector<int> others;
  // Under a CPU quota smaller than the mask /proc/loadavg counts the host's tasks, not ours: no samples, passive.
  if (quota == 0 || quota >= cpus) {
    for (int i = 0; i < 4; ++i) {
      if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const int n = runnable_tasks(read_text("/proc/loadavg"));
      if (n < 1) break;  // unreadable: decide on the samples so far (none: passive)
      others.push_back(n - 1);
    }
  }
  bool ok = false;
  switch (choose_wait_default(others, cpus)) {
    case WaitDefault::ShortSpin:
      ok = setenv("GOMP_SPINCOUNT", std::to_string(kShortSpinCount).c_str(), 1) == 0 && setenv(kDefaulted, "spin", 1) == 0;
      break;
    case WaitDefault::Passive:
      ok = setenv("OMP_WAIT_POLICY", "passive", 1) == 0 && setenv(kDefaulted, "passive", 1) == 0;
      break;
  }
  // Without the variable the new process would sample and re-execute again: never execute it then.
  if (ok) execv("/proc/self/exe", argv);
  // Only reached when execv failed (no /proc): carry on with the runtime's default waiting.
  unsetenv("OMP_WAIT_POLICY");
  unsetenv("GOMP_SPINCOUNT");
  unsetenv(kDefaulted);
}

std::string thread_summary() {
  const int n = core::num_threads();
  std::string policy;
  // The marker counts only while the variables are still the ones it was set with (a child process may inherit
  // it beside a policy of its own).
  const auto value = [](const char* name) { return set(name) ? std::string_view(std::getenv(name)) : std::string_view(); };
  const std::string spin_count = std::to_string(kShortSpinCount);
  if (value(kDefaulted) == "spin" && value("GOMP_SPINCOUNT") == spin_count && !set("OMP_WAIT_POLICY")) {
    policy = "short spin wait";
  } else if (value(kDefaulted) == "passive" && value("OMP_WAIT_POLICY") == "passive" && !set("GOMP_SPINCOUNT")) {
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
