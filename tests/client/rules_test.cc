// The header-only client against the agent's step-event rules. Both take the limits and checks
// from one definition (stepwatch/detail/step_event_rules.h), so what is left to prove is that the
// client's own types and messages keep them: the same constants in its types, the same verdicts
// on job ids and section names, and over the shared table of edge cases
// (tests/data/step_event_cases.json) exactly the events the agent's parser accepts.
#include <climits>
#include <cstring>
#include <string>

#include "agent/step_event_parser.h"
#include "common/file.h"
#include "common/json.h"
#include "common/step_event_rules.h"
#include "gtest/gtest.h"
#include "stepwatch/client.h"
#include "tests/data/step_event_cases.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch {
namespace {

namespace rules = step_event;

TEST(ClientRulesTest, ConstantsEqualTheRules) {
  EXPECT_EQ(kMaxDatagramBytes, rules::kMaxDatagramBytes);
  EXPECT_EQ(kMaxJobBytes, rules::kMaxJobBytes);
  EXPECT_EQ(kMaxSeconds, rules::kMaxSeconds);
  for (int id : {rules::kStepS, rules::kDataS, rules::kComputeS, rules::kCommS}) {
    EXPECT_EQ(kMaxSeconds, rules::kFieldRules[id].number_max) << rules::kFieldRules[id].name;
  }
  EXPECT_EQ(kMaxWorldSize, rules::kFieldRules[rules::kWorldSize].int_max);
  EXPECT_EQ(static_cast<size_t>(kMaxSections), rules::kMaxSections);
  EXPECT_EQ(kMaxSectionNameBytes, rules::kMaxSectionNameBytes);
  EXPECT_EQ(kMaxSeconds, rules::kFieldRules[rules::kSections].number_max);
  // The same names are refused: every byte value, and the reserved names.
  for (int c = 0; c < 256; ++c) {
    const std::string name(1, static_cast<char>(c));
    EXPECT_EQ(ValidateSectionName(name) == nullptr, rules::ValidateSectionName(name).ok()) << c;
  }
  for (const char* reserved : rules::kReservedSectionNames) {
    EXPECT_NE(ValidateSectionName(reserved), nullptr) << reserved;
  }
  EXPECT_EQ(kMaxGpuIndex, rules::kFieldRules[rules::kGpu].int_max);
  EXPECT_EQ(kMaxGpuIndex, rules::kFieldRules[rules::kLocalRank].int_max);
  // dp_rank, pp_stage and tp_rank are ints here: their whole non-negative range is allowed.
  for (int id : {rules::kDpRank, rules::kPpStage, rules::kTpRank}) {
    EXPECT_EQ(int64_t{INT_MAX}, rules::kFieldRules[id].int_max) << rules::kFieldRules[id].name;
  }

  // And the published copy says the same.
  absl::StatusOr<std::string> text = ReadFile(test::SourcePath("proto/step_event_rules.json"));
  ASSERT_OK(text);
  absl::StatusOr<json::Value> doc = json::Parse(*text);
  ASSERT_OK(doc);
  int found = 0;
  for (const auto& [key, value] : doc->as_object()) {
    if (key == "max_datagram_bytes") {
      EXPECT_EQ(value.as_int64(), static_cast<int64_t>(kMaxDatagramBytes));
      ++found;
    }
    if (key != "job") continue;
    for (const auto& [k, v] : value.as_object()) {
      if (k == "max_bytes") {
        EXPECT_EQ(v.as_int64(), static_cast<int64_t>(kMaxJobBytes));
        ++found;
      }
    }
  }
  EXPECT_EQ(found, 2);
}

TEST(ClientRulesTest, TheCharacterCheckIsThePublishedCharacterSet) {
  for (int c = 0; c < 256; ++c) {
    const char ch = static_cast<char>(c);
    const bool listed = c != 0 && std::strchr(rules::kSectionNameCharacters, c) != nullptr;
    EXPECT_EQ(rules::IsSectionNameCharacter(ch), listed) << c;
  }
}

TEST(ClientRulesTest, JobVerdictsEqualTheAgentsOnEveryOneAndTwoByteId) {
  int refused = 0;
  for (int a = 0; a < 256; ++a) {
    for (int b = -1; b < 256; ++b) {
      std::string job(1, static_cast<char>(a));
      if (b >= 0) job.push_back(static_cast<char>(b));
      const bool client = ValidateJob(job) == nullptr;
      ASSERT_EQ(client, rules::ValidateJob(job).ok()) << a << " " << b;
      refused += client ? 0 : 1;
    }
  }
  // Control characters, lone continuation bytes, truncated sequences: a good share is refused.
  EXPECT_GT(refused, 20000);
  EXPECT_NE(ValidateJob(std::string(kMaxJobBytes + 1, 'j')), nullptr);
  EXPECT_FALSE(rules::ValidateJob(std::string(kMaxJobBytes + 1, 'j')).ok());
}

// The client's own verdict on a case: nullopt when its types cannot hold the values (an int
// option takes a negative value as "unset", and int64 ends where it ends).
std::optional<bool> ClientAccepts(const test::StepEventCase& c, std::string* datagram) {
  rules::Fields f;
  if (!test::ToFields(c, &f)) return std::nullopt;
  auto as_int = [](int64_t v) -> std::optional<int> {
    if (v < 0 || v > INT_MAX) return std::nullopt;
    return static_cast<int>(v);
  };
  ReporterOptions o;
  o.use_environment = false;
  o.background = false;
  o.warn_on_stderr = false;
  o.socket_path = "/nonexistent/stepwatch-client-rules-test.sock";
  o.job = std::string(f.job);
  auto rank = as_int(f.rank);
  auto world = as_int(f.world_size);
  if (!rank || !world) return std::nullopt;
  o.rank = *rank;
  o.world_size = *world;
  for (auto [field, out] : {std::pair{f.local_rank, &o.local_rank}, std::pair{f.gpu, &o.gpu},
                            std::pair{f.dp_rank, &o.dp_rank}, std::pair{f.pp_stage, &o.pp_stage},
                            std::pair{f.tp_rank, &o.tp_rank}}) {
    if (!field) continue;
    auto v = as_int(*field);
    if (!v) return std::nullopt;
    *out = *v;
  }
  if (o.job.empty()) return std::nullopt;  // an empty job means "from the environment"
  StepRecord r;
  r.step = f.step;
  r.step_s = f.step_seconds;
  r.data_s = f.data_seconds;
  r.compute_s = f.compute_seconds;
  r.comm_s = f.comm_seconds;
  r.samples = f.samples;
  Reporter reporter(o);
  for (const auto& [name, seconds] : f.sections) {
    const int id = reporter.SectionId(name);
    if (id < 0) return false;  // a name the client refuses (or a 17th)
    r.SetSection(id, seconds);
  }
  if (!reporter.ok() || ValidateStepRecord(r) != nullptr) return false;
  char buf[4096];
  const size_t n = reporter.Encode(r, buf, sizeof(buf));
  EXPECT_GT(n, 0u);
  datagram->assign(buf, n);
  return true;
}

TEST(ClientRulesTest, AcceptsExactlyWhatTheAgentAccepts) {
  const std::vector<test::StepEventCase> cases = test::LoadStepEventCases();
  ASSERT_GE(cases.size(), 70u);
  int checked = 0;
  int refused = 0;
  for (const test::StepEventCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::string sent;
    const std::optional<bool> client = ClientAccepts(c, &sent);
    if (!client) continue;
    ++checked;
    EXPECT_EQ(*client, c.accept);
    // What the client sends, the agent takes, with the same values; what it refuses, the agent
    // refuses too.
    const std::string datagram = *client ? sent : test::EncodeDatagram(c);
    v1::StepEvent e;
    const std::optional<agent::Rejection> r = agent::ParseStepEvent(datagram, &e);
    EXPECT_EQ(!r.has_value(), *client) << datagram << (r ? ": " + r->detail : "");
    if (*client && !r) {
      EXPECT_EQ(e.job(), c.values[rules::kJob]->text);
      EXPECT_EQ(e.world_size(), c.values[rules::kWorldSize]->integer);
      EXPECT_DOUBLE_EQ(e.step_seconds(), c.values[rules::kStepS]->number);
      EXPECT_EQ(e.has_samples(), c.values[rules::kSamples].has_value());
      const std::vector<rules::Section> sections = c.values[rules::kSections]
                                                       ? c.values[rules::kSections]->sections
                                                       : std::vector<rules::Section>();
      ASSERT_EQ(static_cast<size_t>(e.sections_size()), sections.size());
      for (const auto& [name, seconds] : sections) {
        EXPECT_DOUBLE_EQ(e.sections().at(name), seconds) << name;
      }
    }
    if (!*client) ++refused;
  }
  // Most of the table reaches the client (the rest cannot be said in its types).
  EXPECT_GE(checked, 60);
  EXPECT_GE(refused, 35);
}

TEST(ClientRulesTest, JobIdsTheAgentWouldRefuseAreRefusedAtConstruction) {
  ReporterOptions o;
  o.use_environment = false;
  o.warn_on_stderr = false;
  o.background = false;
  o.job = std::string(kMaxJobBytes, 'j');
  EXPECT_TRUE(Reporter(o).ok());
  o.job += "j";
  Reporter over(o);
  EXPECT_FALSE(over.ok());
  EXPECT_NE(over.error().find("256"), std::string::npos) << over.error();
  EXPECT_FALSE(over.Send(StepRecord{0, 0.1, {}, {}, {}, {}}));
  o.job = "a\xff";  // not UTF-8: the agent's JSON parser would refuse it
  EXPECT_FALSE(Reporter(o).ok());
  EXPECT_NE(ValidateJob("a\xff"), nullptr);
  EXPECT_NE(ValidateJob("\xed\xa0\x80"), nullptr);  // a surrogate
  EXPECT_EQ(ValidateJob("\xf0\x9f\x9a\x80"), nullptr);
}

}  // namespace
}  // namespace stepwatch
