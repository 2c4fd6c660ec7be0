#include "common/log.h"

#include <chrono>

#include "gtest/gtest.h"

namespace stepwatch {
namespace {

TEST(LogRateLimiterTest, AllowsBurstThenSuppressesAndReportsCount) {
  // A long period so that the window cannot roll over during the test.
  LogRateLimiter limiter(3, std::chrono::hours(1));
  uint64_t suppressed = 99;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limiter.Allow(&suppressed));
    EXPECT_EQ(suppressed, 0u);
  }
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(limiter.Allow(&suppressed));
}

TEST(LogRateLimiterTest, NewWindowReportsSuppressedCount) {
  LogRateLimiter limiter(1, std::chrono::nanoseconds(1));
  uint64_t suppressed = 0;
  EXPECT_TRUE(limiter.Allow(&suppressed));
  // With a 1 ns period every call opens a new window, so each is allowed.
  EXPECT_TRUE(limiter.Allow(&suppressed));
  EXPECT_EQ(suppressed, 0u);
}

}  // namespace
}  // namespace stepwatch
