#include "common/step_event_rules.h"

#include <cmath>
#include <string>

#include "common/file.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "tests/data/step_event_cases.h"

namespace stepwatch::step_event {
namespace {

const json::Value* Member(const json::Value& object, const std::string& name) {
  for (const auto& [key, value] : object.as_object()) {
    if (key == name) return &value;
  }
  return nullptr;
}

// The member as an integer; fails the test when it is missing or not one.
int64_t Integer(const json::Value& object, const std::string& name) {
  const json::Value* v = Member(object, name);
  EXPECT_TRUE(v != nullptr && v->is_integer()) << name;
  return v != nullptr && v->is_integer() ? v->as_int64() : -1;
}

// proto/step_event_rules.json, which the clients' tests read, says what the constants say.
TEST(StepEventRulesTest, PublishedRulesEqualTheConstants) {
  absl::StatusOr<std::string> text = ReadFile(test::SourcePath("proto/step_event_rules.json"));
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<json::Value> doc = json::Parse(*text);
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(Integer(*doc, "version"), kVersion);
  EXPECT_EQ(Integer(*doc, "max_datagram_bytes"), static_cast<int64_t>(kMaxDatagramBytes));
  const json::Value* job = Member(*doc, "job");
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(Integer(*job, "min_bytes"), 1);
  EXPECT_EQ(Integer(*job, "max_bytes"), static_cast<int64_t>(kMaxJobBytes));
  const json::Value* below = Member(*doc, "rank_below_world_size");
  ASSERT_TRUE(below != nullptr && below->is_bool() && below->as_bool());

  const json::Value* fields = Member(*doc, "fields");
  ASSERT_TRUE(fields != nullptr && fields->is_array());
  ASSERT_EQ(fields->as_array().size(), static_cast<size_t>(kFieldCount));
  for (int id = 0; id < kFieldCount; ++id) {
    const FieldRule& rule = kFieldRules[id];
    const json::Value& f = fields->as_array()[id];
    SCOPED_TRACE(rule.name);
    EXPECT_EQ(Member(f, "name")->as_string(), rule.name);
    EXPECT_EQ(Member(f, "alias")->as_string(), rule.alias);
    EXPECT_EQ(Member(f, "required")->as_bool(), rule.required);
    EXPECT_EQ(Member(f, "part_of_step")->as_bool(), rule.part_of_step);
    const std::string& type = Member(f, "type")->as_string();
    switch (rule.type) {
      case FieldType::kString:
        EXPECT_EQ(type, "string");
        break;
      case FieldType::kInteger:
        EXPECT_EQ(type, "integer");
        EXPECT_EQ(Integer(f, "min"), rule.int_min);
        EXPECT_EQ(Integer(f, "max"), rule.int_max);
        break;
      case FieldType::kNumber:
        EXPECT_EQ(type, "number");
        EXPECT_EQ(Member(f, "min")->as_double(), rule.number_min);
        EXPECT_EQ(Member(f, "max")->as_double(), rule.number_max);
        EXPECT_EQ(Member(f, "min_exclusive")->as_bool(), rule.min_exclusive);
        break;
    }
  }
}

TEST(StepEventRulesTest, FieldsAreFoundByEitherSpelling) {
  for (int id = 0; id < kFieldCount; ++id) {
    EXPECT_EQ(FindField(kFieldRules[id].name), id);
    EXPECT_EQ(FindField(kFieldRules[id].alias), id);
  }
  EXPECT_EQ(FindField("pid"), -1);
  EXPECT_EQ(FindField("step_seconds"), -1);  // the datagram keeps its short keys
}

// Validate() gives every representable case of the shared table its verdict, naming the field.
TEST(StepEventRulesTest, SharedEdgeCases) {
  const std::vector<test::StepEventCase> cases = test::LoadStepEventCases();
  ASSERT_GE(cases.size(), 40u);
  int checked = 0;
  for (const test::StepEventCase& c : cases) {
    SCOPED_TRACE(c.name);
    Fields fields;
    if (!test::ToFields(c, &fields)) continue;  // over 64 bits: the parser test has it
    ++checked;
    const absl::Status s = Validate(fields);
    EXPECT_EQ(s.ok(), c.accept) << s;
    if (!s.ok()) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(s.message().rfind(c.field, 0), 0u) << s.message();
    }
  }
  EXPECT_GE(checked, static_cast<int>(cases.size()) - 2);
}

TEST(StepEventRulesTest, JobMustBeWellFormedUtf8) {
  EXPECT_TRUE(ValidateJob("mod\xc3\xa8le").ok());
  EXPECT_FALSE(ValidateJob("a\xff").ok());               // not UTF-8
  EXPECT_FALSE(ValidateJob("a\xc3").ok());               // truncated
  EXPECT_FALSE(ValidateJob("\xc0\xaf").ok());            // overlong '/'
  EXPECT_FALSE(ValidateJob("\xed\xa0\x80").ok());        // a surrogate
  EXPECT_FALSE(ValidateJob("\xf4\x90\x80\x80").ok());    // over U+10FFFF
  EXPECT_TRUE(ValidateJob("\xf0\x9f\x9a\x80").ok());     // U+1F680
  EXPECT_FALSE(ValidateJob(std::string(1, '\0')).ok());  // NUL
}

TEST(StepEventRulesTest, DroppedIsCheckedButNotRequired) {
  Fields f;
  f.job = "j";
  f.world_size = 1;
  f.step_seconds = 1;
  EXPECT_TRUE(Validate(f).ok());
  f.dropped = -1;
  EXPECT_EQ(Validate(f).message().rfind("dropped", 0), 0u);
  f.dropped = 5;
  EXPECT_TRUE(Validate(f).ok());
}

}  // namespace
}  // namespace stepwatch::step_event
