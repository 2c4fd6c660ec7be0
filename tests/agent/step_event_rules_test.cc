#include "common/step_event_rules.h"

#include <cmath>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "tests/data/step_event_cases.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::step_event {
namespace {

using test::StatusIs;

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
  ASSERT_OK(text);
  absl::StatusOr<json::Value> doc = json::Parse(*text);
  ASSERT_OK(doc);
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
      case FieldType::kSections: {
        EXPECT_EQ(type, "object");
        EXPECT_EQ(Member(f, "min")->as_double(), rule.number_min);
        EXPECT_EQ(Member(f, "max")->as_double(), rule.number_max);
        EXPECT_EQ(Member(f, "min_exclusive")->as_bool(), rule.min_exclusive);
        EXPECT_EQ(Integer(f, "max_entries"), static_cast<int64_t>(kMaxSections));
        EXPECT_EQ(Integer(f, "name_min_bytes"), 1);
        EXPECT_EQ(Integer(f, "name_max_bytes"), static_cast<int64_t>(kMaxSectionNameBytes));
        // "A-Za-z0-9_.:/-" spelt out equals the constant's characters.
        std::string spelt;
        const std::string ranges = Member(f, "name_characters")->as_string();
        for (size_t i = 0; i < ranges.size(); ++i) {
          if (i + 2 < ranges.size() && ranges[i + 1] == '-') {
            for (char c = ranges[i]; c <= ranges[i + 2]; ++c) spelt.push_back(c);
            i += 2;
          } else {
            spelt.push_back(ranges[i]);
          }
        }
        EXPECT_EQ(spelt, kSectionNameCharacters);
        const json::Value* reserved = Member(f, "reserved_names");
        ASSERT_TRUE(reserved != nullptr && reserved->is_array());
        ASSERT_EQ(reserved->as_array().size(), std::size(kReservedSectionNames));
        for (size_t i = 0; i < std::size(kReservedSectionNames); ++i) {
          EXPECT_EQ(reserved->as_array()[i].as_string(), kReservedSectionNames[i]);
        }
        break;
      }
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
  const auto invalid = StatusIs(absl::StatusCode::kInvalidArgument);
  EXPECT_OK(ValidateJob("mod\xc3\xa8le"));
  EXPECT_THAT(ValidateJob("a\xff"), invalid);               // not UTF-8
  EXPECT_THAT(ValidateJob("a\xc3"), invalid);               // truncated
  EXPECT_THAT(ValidateJob("\xc0\xaf"), invalid);            // overlong '/'
  EXPECT_THAT(ValidateJob("\xed\xa0\x80"), invalid);        // a surrogate
  EXPECT_THAT(ValidateJob("\xf4\x90\x80\x80"), invalid);    // over U+10FFFF
  EXPECT_OK(ValidateJob("\xf0\x9f\x9a\x80"));               // U+1F680
  EXPECT_THAT(ValidateJob(std::string(1, '\0')), invalid);  // NUL
}

TEST(StepEventRulesTest, SectionNames) {
  for (const char* ok : {"forward", "a", "Data", "COMM", "layer_1.attn:qkv/fwd-0", "0", "-", "/"}) {
    EXPECT_OK(ValidateSectionName(ok)) << ok;
  }
  EXPECT_OK(ValidateSectionName(std::string(kMaxSectionNameBytes, 'x')));
  const std::pair<std::string, const char*> bad[] = {
      {"", "empty"},
      {std::string(kMaxSectionNameBytes + 1, 'x'), "65 bytes"},
      {"forward pass", "byte 7"},
      {"fwd\"", "byte 3"},
      {"r\xc3\xa9seau", "byte 1"},
      {std::string("a\0b", 3), "byte 1"},
      {"data", "built-in"},
      {"compute", "built-in"},
      {"comm", "built-in"},
  };
  for (const auto& [name, why] : bad) {
    const absl::Status s = ValidateSectionName(name);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(s.message().rfind("sections", 0), 0u) << s.message();
    EXPECT_NE(s.message().find(why), std::string::npos) << s.message();
  }
}

TEST(StepEventRulesTest, SectionsAreCheckedInValidate) {
  Fields f;
  f.job = "j";
  f.world_size = 1;
  f.step_seconds = 1;
  std::vector<Section> sections = {{"forward", 0.5}, {"backward", 0}};
  f.sections = sections;
  EXPECT_OK(Validate(f));
  auto message = [&] { return std::string(Validate(f).message()); };
  sections[1].second = -1;
  f.sections = sections;
  EXPECT_EQ(message(), "sections.backward must be >= 0, got -1");
  sections[1].second = std::nan("");
  f.sections = sections;
  EXPECT_EQ(message(), "sections.backward is not finite");
  sections[1].second = kMaxSeconds * 2;
  f.sections = sections;
  EXPECT_EQ(message(), "sections.backward 172800 s is over 86400");
  sections[1] = {"forward", 1};
  f.sections = sections;
  EXPECT_EQ(message(), "sections.forward given twice");
  sections.clear();
  for (size_t i = 0; i < kMaxSections; ++i) sections.emplace_back(absl::StrCat("s", i), 0.01);
  f.sections = sections;
  EXPECT_OK(Validate(f));
  sections.emplace_back("one-more", 0.01);
  f.sections = sections;
  EXPECT_EQ(message(), "sections: 17 entries, the limit is 16");
  EXPECT_EQ(FindField("sections"), kSections);
}

TEST(StepEventRulesTest, DroppedIsCheckedButNotRequired) {
  Fields f;
  f.job = "j";
  f.world_size = 1;
  f.step_seconds = 1;
  EXPECT_OK(Validate(f));
  f.dropped = -1;
  EXPECT_EQ(Validate(f).message().rfind("dropped", 0), 0u);
  f.dropped = 5;
  EXPECT_OK(Validate(f));
}

}  // namespace
}  // namespace stepwatch::step_event
