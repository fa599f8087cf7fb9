// SPDX-License-Identifier: Apache-2.0
// The wait-policy default: which policy a run-queue sample picks, and the /proc/loadavg field it is read from.
#include <gtest/gtest.h>

#include <vector>

#include "app/threads.h"

namespace fp4serve::app {
namespace {

TEST(WaitDefault, IdleMachineGetsTheShortSpin) {
  const std::vector<int> none{0, 0, 0};
  EXPECT_EQ(choose_wait_default(none, 2), WaitDefault::ShortSpin);
  EXPECT_EQ(choose_wait_default(none, 1), WaitDefault::ShortSpin);
}

TEST(WaitDefault, AnyBusySampleOnASmallMachineGetsPassive) {
  // One other runnable task in one of three samples is enough below 16 CPUs.
  const std::vector<int> one_busy{0, 1, 0};
  EXPECT_EQ(choose_wait_default(one_busy, 2), WaitDefault::Passive);
  EXPECT_EQ(choose_wait_default(one_busy, 15), WaitDefault::Passive);
  const std::vector<int> build{5, 7, 6};
  EXPECT_EQ(choose_wait_default(build, 2), WaitDefault::Passive);
}

TEST(WaitDefault, LargeMachineToleratesCpusOver16Others) {
  const std::vector<int> two{2, 1, 2};
  EXPECT_EQ(choose_wait_default(two, 32), WaitDefault::ShortSpin);
  EXPECT_EQ(choose_wait_default(two, 31), WaitDefault::Passive);  // 31/16 = 1 allowed
  const std::vector<int> three{0, 3, 0};
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

}  // namespace
}  // namespace fp4serve::app
