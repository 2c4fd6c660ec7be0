#include "common/net.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch {
namespace {

using test::StatusIs;

TEST(ParseHostPortTest, AcceptsCommonForms) {
  auto a = ParseHostPort("127.0.0.1:7070");
  ASSERT_OK(a);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 7070);
  auto b = ParseHostPort("[::1]:0");
  ASSERT_OK(b);
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 0);
  auto c = ParseHostPort(":9464");
  ASSERT_OK(c);
  EXPECT_EQ(c->host, "");
  EXPECT_EQ(c->port, 9464);
}

TEST(ParseHostPortTest, RejectsBadInput) {
  for (const char* bad : {"localhost", "host:", "host:x", "host:70000", "[::1]", "[::1]7070", ""}) {
    EXPECT_THAT(ParseHostPort(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

}  // namespace
}  // namespace stepwatch
