// SPDX-License-Identifier: Apache-2.0
// The CPU thread default. OpenMP's default lets idle worker threads spin for a while before sleeping; on a machine
// whose cores are busy with other work a spinning thread holds a core its descheduled siblings need, and every
// parallel region then costs a scheduler time slice (measured in README "Threads": decode up to 20× slower than
// --threads 1). Passive waiting has no such cliff and costs little on an idle machine, so it is fp4serve's default.
#pragma once

#include <string>

namespace fp4serve::app {

/// libgomp reads OMP_WAIT_POLICY / GOMP_SPINCOUNT once, when the library is loaded, before main runs. So when
/// neither is set this sets OMP_WAIT_POLICY=passive and re-executes /proc/self/exe with the same arguments (the
/// user's own setting always wins). Returns normally when no re-execution is needed or execv fails (then the
/// runtime's default stays, and thread_summary says so).
void default_to_passive_wait(char** argv);

/// "2 threads, passive wait" / "1 thread, OMP_WAIT_POLICY=active": what generate's summary line shows.
std::string thread_summary();

}  // namespace fp4serve::app
