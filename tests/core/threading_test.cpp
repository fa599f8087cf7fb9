// SPDX-License-Identifier: Apache-2.0
// core::release_idle_threads: the calling thread's idle OpenMP workers end (they count against libgomp's spinning
// limit of one managed thread per CPU), and a later parallel region still runs on a new team.
#include "core/threading.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

namespace fp4serve::core {
namespace {

// The threads of this process, as Linux lists them.
int process_threads() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// process_threads() once it equals `want`, or its last value after 2 s: a joined thread leaves /proc/self/task a
// little after pthread_join returns.
int process_threads_settled(int want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int n = process_threads();
  while (n != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    n = process_threads();
  }
  return n;
}

// Runs a parallel region of `threads` threads and returns how many took part.
int run_region(int threads) {
  std::atomic<int> seen{0};
#pragma omp parallel num_threads(threads)
  seen.fetch_add(1);
  return seen.load();
}

TEST(Threading, ReleaseIdleThreadsEndsTheCallersIdleWorkers) {
  ASSERT_TRUE(release_idle_threads());  // whatever earlier code left
  const int before = process_threads();
  ASSERT_EQ(run_region(3), 3);
  ASSERT_EQ(process_threads(), before + 2) << "the region's two workers stay, idle, after it";
  EXPECT_TRUE(release_idle_threads());
  EXPECT_EQ(process_threads_settled(before), before) << "the idle workers were not ended";
  EXPECT_EQ(run_region(3), 3) << "a later region must get a new team";
  EXPECT_TRUE(release_idle_threads());
  EXPECT_EQ(process_threads_settled(before), before);
}

TEST(Threading, ReleaseIdleThreadsWithoutATeamIsHarmless) {
  ASSERT_TRUE(release_idle_threads());
  const int before = process_threads();
  EXPECT_TRUE(release_idle_threads());
  EXPECT_EQ(process_threads(), before);
}

}  // namespace
}  // namespace fp4serve::core
