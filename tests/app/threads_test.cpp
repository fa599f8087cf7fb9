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
  const std::vector<int> late{3, 2, 1, 0};
  EXPECT_EQ(choose_wait_default(late, 2), WaitDefault::ShortSpin);
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

}  // namespace
}  // namespace fp4serve::app
