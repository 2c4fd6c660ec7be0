#include "common/check.h"

#include "gtest/gtest.h"

namespace stepwatch {
namespace {

int Evaluations(int* count) {
  ++*count;
  return *count;
}

TEST(CheckDeathTest, FailedCheckLogsFileLineAndMessageThenAborts) {
  const int slots = 3;
  EXPECT_DEATH(SW_CHECK(slots > 4) << "slot " << 7 << " of " << slots,
               "check_test.cc:[0-9]+\\] Check failed: slots > 4: slot 7 of 3");
  EXPECT_DEATH(SW_CHECK(slots == 0), "Check failed: slots == 0\n");
}

TEST(CheckTest, PassingCheckEvaluatesTheConditionOnceAndNotTheMessage) {
  int conditions = 0;
  int messages = 0;
  SW_CHECK(Evaluations(&conditions) == 1) << Evaluations(&messages);
  EXPECT_EQ(conditions, 1);
  EXPECT_EQ(messages, 0);
}

TEST(CheckTest, WorksAsTheBodyOfAnIfElse) {
  bool taken = false;
  if (taken)
    SW_CHECK(false) << "never reached";
  else
    taken = true;
  EXPECT_TRUE(taken);
}

#ifdef NDEBUG
TEST(CheckTest, DcheckIsCompiledOutUnderNdebug) {
  int conditions = 0;
  SW_DCHECK(Evaluations(&conditions) < 0) << "not evaluated";
  EXPECT_EQ(conditions, 0);
}
#else
TEST(CheckDeathTest, DcheckAbortsInDebugBuilds) {
  EXPECT_DEATH(SW_DCHECK(1 + 1 == 3) << "arithmetic", "Check failed: 1 \\+ 1 == 3: arithmetic");
}
#endif

}  // namespace
}  // namespace stepwatch
