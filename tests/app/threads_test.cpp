// SPDX-License-Identifier: Apache-2.0
// The wait-policy default: which policy a run-queue sample picks, and the /proc/loadavg field it is read from.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "app/threads.h"

namespace fp4serve::app {
namespace {

TEST(WaitDefault, IdleMachineGetsTheShortSpin) {
  const std::vector<int> none{0, 0, 0};
  EXPECT_EQ(choose_wait_default(none, 2), WaitDefault::ShortSpin);
  EXPECT_EQ(choose_wait_default(none, 1), WaitDefault::ShortSpin);
}

TEST(WaitDefault, SteadyCompetitionOnASmallMachineGetsPassive) {
  // One other runnable task in every sample is enough below 16 CPUs.
  const std::vector<int> one_busy{1, 1, 2, 1};
  EXPECT_EQ(choose_wait_default(one_busy, 2), WaitDefault::Passive);
  EXPECT_EQ(choose_wait_default(one_busy, 15), WaitDefault::Passive);
  const std::vector<int> build{5, 7, 6, 4};
  EXPECT_EQ(choose_wait_default(build, 2), WaitDefault::Passive);
}

TEST(WaitDefault, ATaskRunnableInOneSampleOnlyIsNoCompetition) {
  // jq starting beside `fp4serve bench model --json | jq` is runnable for a moment.
  const std::vector<int> blip{1, 0, 0, 0};
  EXPECT_EQ(choose_wait_default(blip, 2), WaitDefault::ShortSpin);
}

TEST(WaitDefault, TheQuietestSampleDecides) {
  // Tasks that finish while fp4serve starts (the tail of a build): the last, quiet sample decides.
  const std::vector<int> finishing{3, 2, 1, 0};
  EXPECT_EQ(choose_wait_default(finishing, 2), WaitDefault::ShortSpin);
  const std::vector<int> never_quiet{3, 2, 1, 1};
  EXPECT_EQ(choose_wait_default(never_quiet, 2), WaitDefault::Passive);
}

TEST(WaitDefault, LargeMachineToleratesCpusOver16Others) {
  const std::vector<int> two{2, 2, 2};
  EXPECT_EQ(choose_wait_default(two, 32), WaitDefault::ShortSpin);
  const std::vector<int> one{1, 1, 1};
  EXPECT_EQ(choose_wait_default(one, 31), WaitDefault::ShortSpin);  // 31/16 = 1 allowed
  EXPECT_EQ(choose_wait_default(two, 31), WaitDefault::Passive);
  const std::vector<int> three{3, 4, 3};
  EXPECT_EQ(choose_wait_default(three, 32), WaitDefault::Passive);
}

TEST(WaitDefault, NoSampleOrNonsenseGetsPassive) {
  EXPECT_EQ(choose_wait_default({}, 8), WaitDefault::Passive);
  const std::vector<int> bad{0, -1, 0};
  EXPECT_EQ(choose_wait_default(bad, 8), WaitDefault::Passive);
  const std::vector<int> none{0};
  EXPECT_EQ(choose_wait_default(none, 0), WaitDefault::Passive);
}

TEST(WaitDefault, RunnableTasksReadsTheFourthField) {
  EXPECT_EQ(runnable_tasks("0.68 1.63 1.86 3/412 12345\n"), 3);
  EXPECT_EQ(runnable_tasks("12.00 9.50 7.25 17/1024 999"), 17);
  EXPECT_EQ(runnable_tasks("0.00 0.00 0.00 1/90 7"), 1);
}

TEST(WaitDefault, RunnableTasksRefusesOtherText) {
  EXPECT_EQ(runnable_tasks(""), -1);
  EXPECT_EQ(runnable_tasks("0.68 1.63 1.86"), -1);
  EXPECT_EQ(runnable_tasks("0.68 1.63 1.86 /412 1"), -1);
  EXPECT_EQ(runnable_tasks("0.68 1.63 1.86 x/412 1"), -1);
  EXPECT_EQ(runnable_tasks("0.68 1.63 1.86 3x/412 1"), -1);
  EXPECT_EQ(runnable_tasks("0.68 1.63 1.86 -3/412 1"), -1);
  EXPECT_EQ(runnable_tasks("0.68 1.63 1.86 99999999999/412 1"), -1);
}

TEST(WaitDefault, CgroupCpuLimitReadsQuotaOverPeriod) {
  EXPECT_EQ(cgroup_cpu_limit("200000 100000\n"), 2);
  EXPECT_EQ(cgroup_cpu_limit("150000 100000"), 1);  // 1.5 CPUs: rounded down
  EXPECT_EQ(cgroup_cpu_limit("50000 100000"), 1);   // under one CPU: still 1
  EXPECT_EQ(cgroup_cpu_limit("800000 100000"), 8);
  EXPECT_EQ(cgroup_cpu_limit("max 100000\n"), 0);  // no quota
  EXPECT_EQ(cgroup_cpu_limit(""), 0);              // no cgroup v2 file
  EXPECT_EQ(cgroup_cpu_limit("200000"), 0);
  EXPECT_EQ(cgroup_cpu_limit("-1 100000"), 0);
  EXPECT_EQ(cgroup_cpu_limit("200000 0"), 0);
  EXPECT_EQ(cgroup_cpu_limit("2e5 100000"), 0);
}

// thread_summary reads the environment: each case sets exactly the variables it names.
class ThreadSummary : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    unsetenv("FP4SERVE_OMP_WAIT_DEFAULTED");
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("GOMP_SPINCOUNT");
  }
  static bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  }
};

TEST_F(ThreadSummary, NamesTheDefaultItChose) {
  setenv("FP4SERVE_OMP_WAIT_DEFAULTED", "spin", 1);
  setenv("GOMP_SPINCOUNT", std::to_string(kShortSpinCount).c_str(), 1);
  EXPECT_TRUE(ends_with(thread_summary(), ", short spin wait")) << thread_summary();
  clear();
  setenv("FP4SERVE_OMP_WAIT_DEFAULTED", "passive", 1);
  setenv("OMP_WAIT_POLICY", "passive", 1);
  EXPECT_TRUE(ends_with(thread_summary(), ", passive wait")) << thread_summary();
}

TEST_F(ThreadSummary, AnInheritedMarkerDoesNotHideTheUsersPolicy) {
  setenv("FP4SERVE_OMP_WAIT_DEFAULTED", "spin", 1);
  setenv("OMP_WAIT_POLICY", "active", 1);
  EXPECT_TRUE(ends_with(thread_summary(), ", OMP_WAIT_POLICY=active")) << thread_summary();
  clear();
  setenv("FP4SERVE_OMP_WAIT_DEFAULTED", "spin", 1);
  setenv("GOMP_SPINCOUNT", "500", 1);
  EXPECT_TRUE(ends_with(thread_summary(), ", GOMP_SPINCOUNT=500")) << thread_summary();
  clear();
  setenv("FP4SERVE_OMP_WAIT_DEFAULTED", "passive", 1);
  EXPECT_TRUE(ends_with(thread_summary(), ", OpenMP default wait")) << thread_summary();
}

}  // namespace
}  // namespace fp4serve::app
