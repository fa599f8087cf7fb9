// SPDX-License-Identifier: Apache-2.0
// The CPU thread default. OpenMP's default lets idle worker threads spin for up to ~300k iterations before they
// sleep; on a machine whose cores are busy with other work a spinning thread holds a core its descheduled siblings
// need, and every parallel region then costs a scheduler time slice (docs/performance.md "Threads": decode up to 20× slower
// than --threads 1). Passive waiting has no such cliff, but on an idle machine it pays a futex wake-up per parallel
// region (a decode step has ~200 of them), and two threads then decoded barely faster than one. So the default
// depends on the machine at start: a short spin when nothing else is runnable, passive waiting otherwise.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace fp4serve::app {

/// Spin iterations of the short-spin default (GOMP_SPINCOUNT). Measured on a 2-core VM, `-t 2`, default model
/// (scripts/bench-thread-default.sh, docs/performance.md "Threads"): idle, decode 86.5 tokens/s at 10000 vs 71.3 passive and
/// 76.8 at the runtime's 300000; beside four busy loops 21.1 at 10000, 23.5 passive and 1.9 at 300000, which is
/// why a busy machine gets passive waiting.
inline constexpr int kShortSpinCount = 10000;

enum class WaitDefault {
  ShortSpin,  ///< GOMP_SPINCOUNT=kShortSpinCount: idle workers spin briefly, then sleep
  Passive,    ///< OMP_WAIT_POLICY=passive: idle workers sleep at once
};

/// The default when the user set neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT. `other_runnable`: for each sample of
/// the scheduler's run queue, the runnable tasks other than the caller; `cpus`: the CPUs this process may run on
/// (its affinity mask). ShortSpin when the
/// sample with the fewest leaves the CPUs to fp4serve's threads (at most cpus/16 others, so a large server's stray
/// daemon does not count; the fewest, so that a process starting beside fp4serve in a pipeline does not count
/// either), Passive otherwise, also with no samples or a negative count (nothing could be read).
WaitDefault choose_wait_default(std::span<const int> other_runnable, int cpus);

/// CPUs a cgroup v2 `cpu.max` file ("QUOTA PERIOD", or "max PERIOD") allows: QUOTA / PERIOD, rounded down and
/// at least 1; 0 when there is no quota ("max") or the text does not have that form.
int cgroup_cpu_limit(std::string_view cpu_max);

/// The runnable tasks /proc/loadavg names (its fourth field, "R/T"), the reader included; -1 when the text does
/// not have that form.
int runnable_tasks(std::string_view loadavg);

/// libgomp (GCC's OpenMP runtime, which the build uses; others ignore GOMP_SPINCOUNT) reads OMP_WAIT_POLICY /
/// GOMP_SPINCOUNT once, when the library is loaded, before main runs. So when neither is set this samples
/// /proc/loadavg (four times, 5 ms apart), sets the variable choose_wait_default picks — passive whenever a cgroup
/// CPU quota (/sys/fs/cgroup/cpu.max) allows fewer CPUs than the affinity mask, since /proc/loadavg then counts the
/// whole host — and re-executes /proc/self/exe with the same arguments (the user's own setting always wins).
/// Returns normally when no re-execution is needed or setenv / execv fail (then the runtime's default stays, and
/// thread_summary says so).
void set_default_wait_policy(char** argv);

/// "2 threads, passive wait" / "2 threads, short spin wait" / "1 thread, OMP_WAIT_POLICY=active": what
/// generate's summary line shows.
std::string thread_summary();

}  // namespace fp4serve::app
