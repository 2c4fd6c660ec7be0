// gMock matchers and assertions for absl::Status and absl::StatusOr<T>:
//
//   EXPECT_THAT(Parse(text), IsOk());
//   EXPECT_THAT(Parse(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
//   ASSERT_OK(WriteFileAtomically(path, data));
//   ASSERT_OK_AND_ASSIGN(json::Value v, json::Parse(text));
//
// A failure prints the status, so no `<< s.status()` is needed.
#pragma once

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stepwatch::test {
namespace internal {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

MATCHER(IsOkMatcher, negation ? "is not OK" : "is OK") {
  const absl::Status& status = GetStatus(arg);
  if (!status.ok()) *result_listener << "the status is " << status;
  return status.ok();
}

MATCHER_P2(StatusIsMatcher, code, message_matcher,
           std::string(negation ? "has not " : "has ") + "code " + absl::StatusCodeToString(code) +
               " and a message that " +
               ::testing::DescribeMatcher<const std::string&>(message_matcher, negation)) {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "the status is " << status;
  if (status.code() != code) return false;
  return ::testing::ExplainMatchResult(message_matcher, std::string(status.message()),
                                       result_listener);
}

}  // namespace internal

// Matches an OK absl::Status or an absl::StatusOr holding a value.
inline auto IsOk() { return internal::IsOkMatcher(); }

// Matches a status (or a StatusOr's status) with `code` and a message that `message_matcher`
// matches (a string or a string matcher); any message without one.
template <typename MessageMatcher>
auto StatusIs(absl::StatusCode code, MessageMatcher message_matcher) {
  return internal::StatusIsMatcher(
      code, ::testing::MatcherCast<const std::string&>(
                ::testing::SafeMatcherCast<const std::string&>(std::move(message_matcher))));
}
inline auto StatusIs(absl::StatusCode code) { return StatusIs(code, ::testing::_); }

}  // namespace stepwatch::test

#define SW_TESTING_CONCAT_INNER(a, b) a##b
#define SW_TESTING_CONCAT(a, b) SW_TESTING_CONCAT_INNER(a, b)

// Fatal and non-fatal: `expr` (an absl::Status or absl::StatusOr) is OK.
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::stepwatch::test::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::stepwatch::test::IsOk())

// Asserts that `rexpr` (an absl::StatusOr<T>) holds a value and moves it into `lhs`, which may
// declare a variable: ASSERT_OK_AND_ASSIGN(auto value, Load()). Only in functions returning void.
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr)                                                        \
  SW_TESTING_ASSERT_OK_AND_ASSIGN_IMPL(SW_TESTING_CONCAT(sw_testing_status_or_, __LINE__), lhs, \
                                       rexpr)
#define SW_TESTING_ASSERT_OK_AND_ASSIGN_IMPL(status_or, lhs, rexpr)      \
  auto status_or = (rexpr);                                              \
  ASSERT_TRUE(status_or.ok()) << "the status is " << status_or.status(); \
  lhs = std::move(status_or).value()
