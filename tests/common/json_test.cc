#include "common/json.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::json {
namespace {

using test::StatusIs;
using ::testing::HasSubstr;

TEST(JsonTest, ParsesFlatObject) {
  auto v = Parse(R"({"job":"j1","rank":3,"step_s":0.25,"ok":true,"x":null})");
  ASSERT_OK(v);
  ASSERT_TRUE(v->is_object());
  EXPECT_EQ(v->Find("job")->as_string(), "j1");
  EXPECT_TRUE(v->Find("rank")->is_integer());
  EXPECT_EQ(v->Find("rank")->as_int64(), 3);
  EXPECT_FALSE(v->Find("step_s")->is_integer());
  EXPECT_DOUBLE_EQ(v->Find("step_s")->as_double(), 0.25);
  EXPECT_TRUE(v->Find("ok")->as_bool());
  EXPECT_TRUE(v->Find("x")->is_null());
  EXPECT_EQ(v->Find("missing"), nullptr);
}

TEST(JsonTest, ParsesNestedArraysAndObjects) {
  auto v = Parse(R"( {"gpus":[{"pids":[1,2]},{"pids":[]}]} )");
  ASSERT_OK(v);
  const auto& gpus = v->Find("gpus")->as_array();
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].Find("pids")->as_array()[1].as_int64(), 2);
  EXPECT_TRUE(gpus[1].Find("pids")->as_array().empty());
}

TEST(JsonTest, StringEscapesAndUtf8) {
  auto v = Parse(R"("a\"b\\c\n\u00e9\ud83d\ude00é")");
  ASSERT_OK(v);
  EXPECT_EQ(v->as_string(), "a\"b\\c\n\xC3\xA9\xF0\x9F\x98\x80\xC3\xA9");
}

TEST(JsonTest, IntegersKeepExactValueAndRejectOverflowAsInteger) {
  auto v = Parse("9223372036854775807");
  ASSERT_OK(v);
  EXPECT_TRUE(v->is_integer());
  EXPECT_EQ(v->as_int64(), INT64_MAX);
  auto big = Parse("9223372036854775808");
  ASSERT_OK(big);
  EXPECT_FALSE(big->is_integer());
  auto neg = Parse("-9223372036854775808");
  ASSERT_OK(neg);
  EXPECT_TRUE(neg->is_integer());
  EXPECT_EQ(neg->as_int64(), INT64_MIN);
  auto exp = Parse("1e3");
  ASSERT_OK(exp);
  EXPECT_FALSE(exp->is_integer());
  EXPECT_DOUBLE_EQ(exp->as_double(), 1000);
}

TEST(JsonTest, RejectsInvalidDocuments) {
  for (const char* bad : {"",
                          "{",
                          "{\"a\":}",
                          "{\"a\":1,}",
                          "[1,]",
                          "NaN",
                          "Infinity",
                          "-",
                          "01",
                          "1.",
                          ".5",
                          "{'a':1}",
                          "{\"a\":1} x",
                          "\"\\x\"",
                          "\"\\ud800\"",
                          "\"abc",
                          "{\"a\":1,\"a\":2}",
                          "tru",
                          "1e999",
                          "\"\x01\"",
                          "\"\xff\"",
                          "\"\xc0\xaf\"",
                          "// c\n1"}) {
    EXPECT_THAT(Parse(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(JsonTest, LimitsDepth) {
  std::string deep(100, '[');
  deep += std::string(100, ']');
  auto v = Parse(deep);
  EXPECT_THAT(v, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too deep")));
  ParseOptions options;
  options.max_depth = 200;
  EXPECT_OK(Parse(deep, options));
}

TEST(JsonTest, QuoteRoundTrips) {
  std::string original = "tab\there \"quoted\" back\\slash \x01 é";
  auto v = Parse(Quote(original));
  ASSERT_OK(v);
  EXPECT_EQ(v->as_string(), original);
}

// Callers check the type before taking the members: a mismatch is a bug, not bad input.
TEST(JsonDeathTest, MembersOfTheWrongTypeAbort) {
  EXPECT_DEATH(Value::Null().as_array(),
               "Check failed: array_ != nullptr: as_array\\(\\) on a null");
  EXPECT_DEATH(Value::String("x").as_object(), "as_object\\(\\) on a string");
}

}  // namespace
}  // namespace stepwatch::json
