#include "agent/step_event_parser.h"

#include <set>
#include <string>

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/data/step_event_cases.h"

namespace stepwatch::agent {
namespace {

constexpr char kValid[] =
    R"({"job":"llama","rank":3,"world_size":8,"step":120,"step_s":0.5,"data_s":0.01,)"
    R"("compute_s":0.4,"comm_s":0.09,"samples":32,"local_rank":3,"gpu":3,"dp_rank":3,)"
    R"("pp_stage":0,"tp_rank":0})";

RejectReason ReasonOf(const std::string& datagram) {
  v1::StepEvent event;
  std::optional<Rejection> r = ParseStepEvent(datagram, &event);
  EXPECT_TRUE(r.has_value()) << "accepted: " << datagram;
  return r ? r->reason : RejectReason::kNotJson;
}

// Replaces `"field":<old value>` in kValid by `"field":<value>`.
std::string WithField(const std::string& field, const std::string& value) {
  std::string s = kValid;
  const std::string key = "\"" + field + "\":";
  const size_t pos = s.find(key);
  EXPECT_NE(pos, std::string::npos) << field;
  const size_t start = pos + key.size();
  const size_t end = s.find_first_of(",}", start);
  return s.substr(0, start) + value + s.substr(end);
}

std::string WithoutField(const std::string& field) {
  std::string s = kValid;
  const std::string key = "\"" + field + "\":";
  const size_t pos = s.find(key);
  const size_t end = s.find_first_of(",}", pos);
  // Remove the member and one adjacent comma.
  if (s[end] == ',') return s.substr(0, pos) + s.substr(end + 1);
  return s.substr(0, pos - 1) + s.substr(end);
}

TEST(StepEventParserTest, AcceptsAllFields) {
  v1::StepEvent e;
  ASSERT_FALSE(ParseStepEvent(kValid, &e).has_value());
  EXPECT_EQ(e.job(), "llama");
  EXPECT_EQ(e.rank(), 3);
  EXPECT_EQ(e.world_size(), 8);
  EXPECT_EQ(e.step(), 120);
  EXPECT_DOUBLE_EQ(e.step_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(e.data_seconds(), 0.01);
  EXPECT_DOUBLE_EQ(e.compute_seconds(), 0.4);
  EXPECT_DOUBLE_EQ(e.comm_seconds(), 0.09);
  EXPECT_EQ(e.samples(), 32);
  EXPECT_EQ(e.local_rank(), 3);
  EXPECT_EQ(e.gpu(), 3);
  EXPECT_EQ(e.dp_rank(), 3);
  EXPECT_TRUE(e.has_pp_stage());
  EXPECT_EQ(e.pp_stage(), 0);
  EXPECT_TRUE(e.has_tp_rank());
}

TEST(StepEventParserTest, OptionalFieldsStayAbsent) {
  v1::StepEvent e;
  ASSERT_FALSE(
      ParseStepEvent(R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1})", &e).has_value());
  EXPECT_FALSE(e.has_data_seconds());
  EXPECT_FALSE(e.has_compute_seconds());
  EXPECT_FALSE(e.has_comm_seconds());
  EXPECT_FALSE(e.has_samples());
  EXPECT_FALSE(e.has_gpu());
  EXPECT_DOUBLE_EQ(e.step_seconds(), 1.0);  // an integral literal is fine for a double field
}

TEST(StepEventParserTest, AcceptsLowerCamelCase) {
  v1::StepEvent e;
  ASSERT_FALSE(ParseStepEvent(R"({"job":"j","rank":1,"worldSize":2,"step":5,"stepS":0.2,)"
                              R"("dataS":0.1,"computeS":0.05,"commS":0.05,"localRank":1,)"
                              R"("dpRank":1,"ppStage":2,"tpRank":3})",
                              &e)
                   .has_value());
  EXPECT_EQ(e.world_size(), 2);
  EXPECT_DOUBLE_EQ(e.step_seconds(), 0.2);
  EXPECT_DOUBLE_EQ(e.data_seconds(), 0.1);
  EXPECT_EQ(e.local_rank(), 1);
  EXPECT_EQ(e.pp_stage(), 2);
  EXPECT_EQ(e.tp_rank(), 3);
}

TEST(StepEventParserTest, IgnoresUnknownFieldsAndSenderOwnedOnes) {
  v1::StepEvent e;
  ASSERT_FALSE(ParseStepEvent(R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,)"
                              R"("future":{"nested":[1,2,{"x":null}]},"pid":999,)"
                              R"("received_unix_nanos":5,"note":"hi"})",
                              &e)
                   .has_value());
  EXPECT_EQ(e.pid(), 0);
  EXPECT_EQ(e.received_unix_nanos(), 0);
}

TEST(StepEventParserTest, NullMeansAbsent) {
  v1::StepEvent e;
  ASSERT_FALSE(ParseStepEvent(WithField("data_s", "null"), &e).has_value());
  EXPECT_FALSE(e.has_data_seconds());
  EXPECT_EQ(ReasonOf(WithField("rank", "null")), RejectReason::kMissingField);
}

TEST(StepEventParserTest, AcceptsUnicodeJob) {
  v1::StepEvent e;
  ASSERT_FALSE(ParseStepEvent(WithField("job", R"("j\u00e9b-\ud83d\ude80")"), &e).has_value());
  EXPECT_EQ(e.job(),
            "j\xc3\xa9"
            "b-\xf0\x9f\x9a\x80");
}

TEST(StepEventParserTest, AcceptsSections) {
  for (bool fast : {true, false}) {
    SCOPED_TRACE(fast);
    const std::string datagram =
        std::string(kValid).substr(0, sizeof(kValid) - 2) +
        R"(,"sections":{"forward":0.012,"backward":2e-2,"layer_1.attn:qkv/fwd-0":0,"x":1}})";
    v1::StepEvent e;
    const auto r =
        fast ? ParseStepEvent(datagram, &e) : ParseStepEventWithoutFastPath(datagram, &e);
    ASSERT_FALSE(r.has_value()) << r->detail;
    ASSERT_EQ(e.sections_size(), 4);
    EXPECT_DOUBLE_EQ(e.sections().at("forward"), 0.012);
    EXPECT_DOUBLE_EQ(e.sections().at("backward"), 0.02);
    EXPECT_DOUBLE_EQ(e.sections().at("layer_1.attn:qkv/fwd-0"), 0);
    EXPECT_DOUBLE_EQ(e.sections().at("x"), 1);
    EXPECT_DOUBLE_EQ(e.compute_seconds(), 0.4);  // the built-in split is untouched
  }
  v1::StepEvent e;
  ASSERT_FALSE(ParseStepEvent(WithField("tp_rank", R"(0,"sections":{})"), &e).has_value());
  EXPECT_EQ(e.sections_size(), 0);
  ASSERT_FALSE(ParseStepEvent(WithField("tp_rank", R"(0,"sections":null)"), &e).has_value());
  EXPECT_EQ(e.sections_size(), 0);
  // An escaped name is the name it spells (the general parser decodes it).
  ASSERT_FALSE(
      ParseStepEvent(WithField("tp_rank", R"(0,"sections":{"\u0066wd":0.5})"), &e).has_value());
  EXPECT_DOUBLE_EQ(e.sections().at("fwd"), 0.5);
}

TEST(StepEventParserTest, RejectsBadSections) {
  auto with = [](const std::string& sections) {
    return WithField("tp_rank", "0,\"sections\":" + sections);
  };
  struct Case {
    std::string sections;
    RejectReason reason;
    const char* detail;  // how the detail starts
  };
  const Case cases[] = {
      {"[]", RejectReason::kWrongType, "sections must be an object, got array"},
      {"\"forward\"", RejectReason::kWrongType, "sections must be an object, got string"},
      {"0.1", RejectReason::kWrongType, "sections must be an object, got number"},
      {R"({"forward":"0.1"})", RejectReason::kWrongType, "sections values must be numbers"},
      {R"({"forward":null})", RejectReason::kWrongType, "sections values must be numbers"},
      {R"({"forward":true})", RejectReason::kWrongType, "sections values must be numbers"},
      {R"({"forward":{"x":1}})", RejectReason::kWrongType, "sections values must be numbers"},
      {R"({"forward":0.1,"forward":0.2})", RejectReason::kNotJson, ""},
      {R"({"forward":-0.1})", RejectReason::kOutOfRange, "sections.forward must be >= 0"},
      {R"({"forward":86401})", RejectReason::kOutOfRange, "sections.forward 86401 s is over"},
      {R"({"forward":1e999})", RejectReason::kNotJson, ""},
      {R"({"":0.1})", RejectReason::kOutOfRange, "sections: a name is empty"},
      {R"({"a b":0.1})", RejectReason::kOutOfRange, "sections: a name has a character"},
      {R"({"a\u0000b":0.1})", RejectReason::kOutOfRange, "sections: a name has a character"},
      {"{\"\xc3\xa9\":0.1}", RejectReason::kOutOfRange, "sections: a name has a character"},
      {R"({"comm":0.1})", RejectReason::kOutOfRange, "sections: \"comm\" is a built-in phase"},
      {"{\"" + std::string(65, 'n') + "\":0.1}", RejectReason::kOutOfRange,
       "sections: a name is 65 bytes"},
  };
  for (const Case& c : cases) {
    for (bool fast : {true, false}) {
      SCOPED_TRACE(c.sections + (fast ? " (fast)" : ""));
      v1::StepEvent e;
      const auto r = fast ? ParseStepEvent(with(c.sections), &e)
                          : ParseStepEventWithoutFastPath(with(c.sections), &e);
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(RejectReasonName(r->reason), std::string(RejectReasonName(c.reason))) << r->detail;
      EXPECT_EQ(r->detail.rfind(c.detail, 0), 0u) << r->detail;
    }
  }
  // 16 entries are fine, 17 are not.
  std::string sixteen = "{";
  for (int i = 0; i < 16; ++i) sixteen += (i ? "," : "") + ("\"s" + std::to_string(i) + "\":0.1");
  v1::StepEvent e;
  ASSERT_FALSE(ParseStepEvent(with(sixteen + "}"), &e).has_value());
  EXPECT_EQ(e.sections_size(), 16);
  const auto r = ParseStepEvent(with(sixteen + ",\"s16\":0.1}"), &e);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->reason, RejectReason::kOutOfRange);
  EXPECT_EQ(r->detail, "sections: 17 entries, the limit is 16");
  EXPECT_EQ(e.sections_size(), 0);  // nothing of a refused event is kept
}

TEST(StepEventParserTest, RejectsNotJson) {
  EXPECT_EQ(ReasonOf(""), RejectReason::kNotJson);
  EXPECT_EQ(ReasonOf("{"), RejectReason::kNotJson);
  EXPECT_EQ(ReasonOf("hello"), RejectReason::kNotJson);
  EXPECT_EQ(ReasonOf(WithField("step_s", "NaN")), RejectReason::kNotJson);
  EXPECT_EQ(ReasonOf(WithField("step_s", "Infinity")), RejectReason::kNotJson);
  EXPECT_EQ(ReasonOf(std::string(kValid) + ","), RejectReason::kNotJson);
  EXPECT_EQ(ReasonOf(std::string(kValid) + std::string(kValid)), RejectReason::kNotJson);
  // Invalid UTF-8 inside a string.
  EXPECT_EQ(ReasonOf(WithField("job", "\"a\xff\"")), RejectReason::kNotJson);
  // The same key twice is malformed JSON for us.
  EXPECT_EQ(ReasonOf(R"({"job":"a","job":"b","rank":0,"world_size":1,"step":0,"step_s":1})"),
            RejectReason::kNotJson);
}

TEST(StepEventParserTest, RejectsNotObject) {
  EXPECT_EQ(ReasonOf("[1,2]"), RejectReason::kNotObject);
  EXPECT_EQ(ReasonOf("42"), RejectReason::kNotObject);
  EXPECT_EQ(ReasonOf("\"job\""), RejectReason::kNotObject);
  EXPECT_EQ(ReasonOf("null"), RejectReason::kNotObject);
}

TEST(StepEventParserTest, RejectsEachMissingRequiredField) {
  for (const char* field : {"job", "rank", "world_size", "step", "step_s"}) {
    SCOPED_TRACE(field);
    EXPECT_EQ(ReasonOf(WithoutField(field)), RejectReason::kMissingField);
  }
  EXPECT_EQ(ReasonOf("{}"), RejectReason::kMissingField);
}

TEST(StepEventParserTest, RejectsWrongTypes) {
  EXPECT_EQ(ReasonOf(WithField("job", "7")), RejectReason::kWrongType);
  EXPECT_EQ(ReasonOf(WithField("rank", "\"3\"")), RejectReason::kWrongType);
  EXPECT_EQ(ReasonOf(WithField("rank", "3.0")), RejectReason::kWrongType);
  EXPECT_EQ(ReasonOf(WithField("rank", "3e0")), RejectReason::kWrongType);
  EXPECT_EQ(ReasonOf(WithField("world_size", "true")), RejectReason::kWrongType);
  EXPECT_EQ(ReasonOf(WithField("step", "1.5")), RejectReason::kWrongType);
  EXPECT_EQ(ReasonOf(WithField("step_s", "\"0.5\"")), RejectReason::kWrongType);
  EXPECT_EQ(ReasonOf(WithField("data_s", "[0.1]")), RejectReason::kWrongType);
  EXPECT_EQ(ReasonOf(WithField("samples", "{}")), RejectReason::kWrongType);
  EXPECT_EQ(ReasonOf(WithField("gpu", "0.5")), RejectReason::kWrongType);
}

TEST(StepEventParserTest, RejectsOutOfRange) {
  EXPECT_EQ(ReasonOf(WithField("rank", "8")), RejectReason::kOutOfRange);  // == world_size
  EXPECT_EQ(ReasonOf(WithField("rank", "-1")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("world_size", "0")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("world_size", "4294967296")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("step", "-1")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("step", "99999999999999999999")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("step_s", "0")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("step_s", "-0.5")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("step_s", "1e400")), RejectReason::kNotJson);  // not finite
  EXPECT_EQ(ReasonOf(WithField("data_s", "-0.01")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("compute_s", "-1")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("comm_s", "-1e-9")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("samples", "-3")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("gpu", "-1")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("job", "\"\"")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("job", "\"" + std::string(kMaxJobBytes + 1, 'x') + "\"")),
            RejectReason::kOutOfRange);
  v1::StepEvent e;
  EXPECT_FALSE(ParseStepEvent(WithField("job", "\"" + std::string(kMaxJobBytes, 'x') + "\""), &e)
                   .has_value());
  EXPECT_FALSE(ParseStepEvent(WithField("data_s", "0"), &e).has_value());  // zero is fine
}

TEST(StepEventParserTest, RejectsAbsurdValuesAndControlCharacters) {
  EXPECT_EQ(ReasonOf(WithField("step_s", "86401")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("compute_s", "1e300")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("comm_s", "90000")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("world_size", "2000000")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("gpu", "1024")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("local_rank", "100000")), RejectReason::kOutOfRange);
  // A terminal escape sequence (ESC [ 2 J clears the screen), DEL, and a C1 control (U+009B,
  // the one-byte CSI).
  EXPECT_EQ(ReasonOf(WithField("job", R"("llm\u001b[2J")")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("job", R"("llm\u007f")")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(WithField("job", R"("llm\u009b31m")")), RejectReason::kOutOfRange);
  v1::StepEvent e;
  // Printable non-ASCII stays valid.
  EXPECT_FALSE(ParseStepEvent(WithField("job", R"("modèle-é")"), &e).has_value());
  EXPECT_FALSE(ParseStepEvent(WithField("step_s", "86400"), &e).has_value());
}

// The shared table (tests/data/step_event_cases.json), which the clients' tests run too: both
// parser paths give each case its expected verdict, refusals as out_of_range or not_json (NaN and
// infinities are not JSON), naming the field the table names.
TEST(StepEventParserTest, SharedEdgeCases) {
  const std::vector<test::StepEventCase> cases = test::LoadStepEventCases();
  ASSERT_GE(cases.size(), 70u);
  for (const test::StepEventCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string datagram = test::EncodeDatagram(c);
    for (bool fast : {true, false}) {
      v1::StepEvent e;
      const std::optional<Rejection> r =
          fast ? ParseStepEvent(datagram, &e) : ParseStepEventWithoutFastPath(datagram, &e);
      EXPECT_EQ(!r.has_value(), c.accept) << datagram << (r ? ": " + r->detail : "");
      if (!r || r->reason == RejectReason::kNotJson) continue;
      EXPECT_EQ(r->reason, RejectReason::kOutOfRange) << r->detail;
      EXPECT_EQ(r->detail.rfind(c.field, 0), 0u) << r->detail;
    }
  }
}

TEST(StepEventParserTest, RejectsDuplicateSpellings) {
  EXPECT_EQ(ReasonOf(R"({"job":"j","rank":0,"world_size":1,"worldSize":1,"step":0,"step_s":1})"),
            RejectReason::kDuplicateField);
}

TEST(StepEventParserTest, RejectsTooLarge) {
  // Valid JSON padded with an unknown field to just over the limit.
  std::string big = R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"pad":")";
  big += std::string(kMaxDatagramBytes - big.size() - 1, 'x');
  big += "\"}";
  ASSERT_EQ(big.size(), kMaxDatagramBytes + 1);
  EXPECT_EQ(ReasonOf(big), RejectReason::kTooLarge);
  // One byte less is accepted.
  big.erase(big.size() - 3, 1);
  v1::StepEvent e;
  EXPECT_FALSE(ParseStepEvent(big, &e).has_value());
}

TEST(StepEventParserTest, RejectsDeepNesting) {
  std::string deep = R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"x":)";
  deep += std::string(100, '[') + std::string(100, ']') + "}";
  EXPECT_EQ(ReasonOf(deep), RejectReason::kNotJson);
}

TEST(StepEventParserTest, ClearsThePreviousEvent) {
  v1::StepEvent e;
  ASSERT_FALSE(ParseStepEvent(kValid, &e).has_value());
  ASSERT_FALSE(
      ParseStepEvent(R"({"job":"k","rank":0,"world_size":1,"step":0,"step_s":1})", &e).has_value());
  EXPECT_FALSE(e.has_data_seconds());
  EXPECT_EQ(e.job(), "k");
}

TEST(StepEventParserTest, ClientDroppedCountIsReportedApartFromTheStep) {
  for (bool fast : {true, false}) {
    SCOPED_TRACE(fast ? "fast path" : "general parser");
    auto parse = fast ? ParseStepEvent : ParseStepEventWithoutFastPath;
    v1::StepEvent e;
    ClientReport report;
    report.dropped = 99;  // reset by the parser
    // An old client: no field, the report says 0.
    ASSERT_FALSE(parse(kValid, &e, &report).has_value());
    EXPECT_EQ(report.dropped, 0u);
    const std::string with_drops = std::string(kValid).insert(1, R"("dropped":12,)");
    ASSERT_FALSE(parse(with_drops, &e, &report).has_value());
    EXPECT_EQ(report.dropped, 12u);
    EXPECT_EQ(e.step(), 120);
    // Without a report to fill, the event still parses (the field is simply not kept).
    ASSERT_FALSE(parse(with_drops, &e, nullptr).has_value());
    // null is "absent", like every optional field.
    ASSERT_FALSE(parse(std::string(kValid).insert(1, R"("dropped":null,)"), &e, &report));
    EXPECT_EQ(report.dropped, 0u);
    // Like every other field: wrong type, negative, fractional, twice are rejected.
    for (const char* bad : {R"("dropped":"3",)", R"("dropped":-1,)", R"("dropped":1.5,)",
                            R"("dropped":1,"dropped":2,)"}) {
      std::optional<Rejection> r = parse(std::string(kValid).insert(1, bad), &e, &report);
      EXPECT_TRUE(r.has_value()) << bad;
    }
  }
  EXPECT_EQ(ReasonOf(std::string(kValid).insert(1, R"("dropped":-1,)")), RejectReason::kOutOfRange);
  EXPECT_EQ(ReasonOf(std::string(kValid).insert(1, R"("dropped":"x",)")), RejectReason::kWrongType);
}

TEST(StepEventParserTest, ReasonNamesAreDistinctSnakeCase) {
  std::set<std::string> names;
  for (int i = 0; i < kRejectReasonCount; ++i) {
    const std::string name = RejectReasonName(static_cast<RejectReason>(i));
    EXPECT_NE(name, "unknown");
    for (char c : name) EXPECT_TRUE(c == '_' || (c >= 'a' && c <= 'z')) << name;
    names.insert(name);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kRejectReasonCount));
}

}  // namespace
}  // namespace stepwatch::agent

namespace stepwatch::agent {
namespace {

// The fast path and the general parser must agree on every input: same verdict, same reason,
// same event. Inputs are valid events mutated at random (bytes replaced, inserted, deleted,
// fields repeated or respelled), plus a fixed list of tricky ones.
void ExpectSameVerdict(const std::string& input) {
  v1::StepEvent fast_event, slow_event;
  const auto fast = ParseStepEvent(input, &fast_event);
  const auto slow = ParseStepEventWithoutFastPath(input, &slow_event);
  ASSERT_EQ(fast.has_value(), slow.has_value()) << input;
  if (fast) {
    EXPECT_EQ(RejectReasonName(fast->reason), RejectReasonName(slow->reason)) << input;
  } else {
    // MessageDifferencer: maps (sections) compare by content, not by serialization order.
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(fast_event, slow_event))
        << input;
  }
}

TEST(StepEventParserTest, FastPathAgreesOnTrickyInputs) {
  const char* cases[] = {
      kValid,
      R"( { "job" : "j" , "rank" : 0 , "world_size" : 1 , "step" : 0 , "step_s" : 1 } )",
      R"({"job":"j","rank":-0,"world_size":1,"step":0,"step_s":1,"data_s":-0})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1e-3,"comm_s":1E+2})",
      R"({"job":"j","rank":0,"world_size":1,"step":123456789012345678,"step_s":1})",
      R"({"job":"j","rank":0,"world_size":1,"step":1234567890123456789,"step_s":1})",
      R"({"job":"j","rank":0,"world_size":1,"step":12345678901234567890,"step_s":1})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":01})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1.})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":.5})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1e})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1e999})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"x":1,"x":2})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"x":{"y":1}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"rank":0})",
      R"({"job":"j","rank":0,"world_size":1,"worldSize":1,"step":0,"step_s":1})",
      R"({"job":"j","rank":"x","world_size":1,"world_size":1,"step":0,"step_s":1})",
      R"({"job":"j\u0041","rank":0,"world_size":1,"step":0,"step_s":1})",
      R"({"jo\u0062":"j","rank":0,"world_size":1,"step":0,"step_s":1})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1}x)",
      R"({"job":"j","rank":null,"world_size":1,"step":0,"step_s":1})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":true})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":nul})",
      "{\"job\":\"j\x01\",\"rank\":0,\"world_size\":1,\"step\":0,\"step_s\":1}",
      "{\"job\":\"\xc3\xa9\",\"rank\":0,\"world_size\":1,\"step\":0,\"step_s\":1}",
      "{}",
      "",
      "{",
      "[]",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{ }})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections": { "a" : 1 , "b":2 } })",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{"a":1,}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{"a":1,"a":1}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{"a":1}"sections":{}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{"a":1},"sections":{}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{"a":-1}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{"a":01}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{"a":null}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{"a":"1"}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{"a\u0062":1}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{"data":1}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{"a":1})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{"a":12345678901234567890}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":{"a":{}}})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":[]})",
      R"({"job":"j","rank":0,"world_size":1,"step":0,"step_s":1,"sections":null})",
  };
  for (const char* c : cases) ExpectSameVerdict(c);
}

TEST(StepEventParserTest, FastPathAgreesOnRandomMutations) {
  const std::string alphabet = "{}[]\":,.-+eE0123456789 \t\\nultrfasjobkwzeidp_SA\x01\xc3\xa9";
  const std::string bases[] = {
      kValid,
      R"({"job":"j","rank":1,"worldSize":2,"step":5,"stepS":0.2,"dataS":0.1,"extra":[1,{"a":2}]})",
      R"({"job":"j","rank":0,"world_size":2,"step":5,"step_s":0.2,"sections":{"fwd":0.1,"bwd":2}})",
  };
  uint64_t state = 42;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<size_t>(state >> 33);
  };
  for (int i = 0; i < 20000; ++i) {
    std::string s = bases[next() % std::size(bases)];
    const int edits = 1 + static_cast<int>(next() % 3);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t pos = next() % s.size();
      switch (next() % 3) {
        case 0:
          s[pos] = alphabet[next() % alphabet.size()];
          break;
        case 1:
          s.insert(pos, 1, alphabet[next() % alphabet.size()]);
          break;
        default:
          s.erase(pos, 1);
      }
    }
    ExpectSameVerdict(s);
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace stepwatch::agent
