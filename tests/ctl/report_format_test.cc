#include "ctl/report_format.h"

#include <string>

#include "common/json.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::ctl {
namespace {

constexpr int64_t kSecond = 1'000'000'000;
// 2023-11-14 22:13:20 UTC.
constexpr int64_t kT0 = 1'700'000'000 * kSecond;

v1::JobReport Finished() {
  v1::JobReport r;
  r.set_job("llm \"7b\"");
  r.set_state("finished");
  r.set_end_reason("exited");
  r.set_world_size(8);
  r.set_first_step(0);
  r.set_last_step(199);
  r.set_start_unix_nanos(kT0);
  r.set_end_unix_nanos(kT0 + 167 * kSecond);
  r.set_updated_unix_nanos(kT0 + 167 * kSecond);
  r.set_step_seconds(0.61);
  r.set_efficiency_ratio(0.64);
  (*r.mutable_time_ratio())["compute"] = 0.6;
  (*r.mutable_time_ratio())["imbalance"] = 0.3;
  (*r.mutable_whatif_speedup_ratio())["stragglers"] = 1.4;
  (*r.mutable_whatif_kind())["stragglers"] = "upper_bound";
  v1::Finding* f = r.add_findings();
  f->set_kind("straggler");
  f->set_rank(3);
  f->set_node("node-0");
  f->set_gpu(3);
  f->set_stage(-1);
  f->set_cause("thermal_throttling");
  f->add_causes("thermal_throttling");
  f->set_severity("warning");
  f->set_summary("rank 3 on node-0 GPU 3: compute +31% vs median");
  f->set_since_step(40);
  f->set_since_unix_nanos(kT0 + 20 * kSecond);
  f->set_until_step(199);
  f->set_until_unix_nanos(kT0 + 167 * kSecond);
  v1::Finding* g = r.add_findings();
  g->set_kind("regression");
  g->set_rank(-1);
  g->set_gpu(-1);
  g->set_severity("warning");
  g->set_summary("step time up");
  g->set_since_step(150);
  g->set_until_step(-1);
  r.set_finding_count(2);
  return r;
}

TEST(ReportFormatTest, TextShowsStateStepsAndEachFindingsSpan) {
  const std::string text = FormatReport(Finished());
  EXPECT_NE(text.find("Job llm \"7b\": finished (every rank's process exited), 8 ranks, steps "
                      "0..199"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ended 2023-11-14 22:16:07 UTC (2m47s)"), std::string::npos) << text;
  EXPECT_NE(text.find("efficiency (ideal / actual step time) 64%"), std::string::npos) << text;
  EXPECT_NE(text.find("40..199"), std::string::npos) << text;
  EXPECT_NE(text.find("150..(active)"), std::string::npos) << text;
  EXPECT_NE(text.find("thermal_throttling"), std::string::npos) << text;
  EXPECT_NE(text.find("1.40x faster"), std::string::npos) << text;

  v1::JobReport unknown = Finished();
  unknown.clear_efficiency_ratio();
  unknown.clear_time_ratio();
  unknown.clear_whatif_speedup_ratio();
  unknown.clear_findings();
  const std::string bare = FormatReport(unknown);
  EXPECT_NE(bare.find("efficiency (ideal / actual step time) unknown"), std::string::npos) << bare;
  EXPECT_EQ(bare.find("Where the step time went"), std::string::npos) << bare;
  EXPECT_NE(bare.find("  none"), std::string::npos) << bare;
}

TEST(ReportFormatTest, JsonHasNumbersAndNullForUnknown) {
  absl::StatusOr<json::Value> v = json::Parse(ReportToJson(Finished()));
  ASSERT_OK(v) << "\n" << ReportToJson(Finished());
  EXPECT_EQ(v->Find("job")->as_string(), "llm \"7b\"");
  EXPECT_EQ(v->Find("state")->as_string(), "finished");
  EXPECT_EQ(v->Find("world_size")->as_int64(), 8);
  EXPECT_EQ(v->Find("first_step")->as_int64(), 0);
  EXPECT_EQ(v->Find("last_step")->as_int64(), 199);
  EXPECT_DOUBLE_EQ(v->Find("efficiency_ratio")->as_double(), 0.64);
  EXPECT_EQ(v->Find("end_time")->as_string(), "2023-11-14T22:16:07.000Z");
  EXPECT_EQ(v->Find("end_unix_nanos")->as_int64(), kT0 + 167 * kSecond);
  EXPECT_DOUBLE_EQ(v->Find("breakdown")->Find("imbalance")->as_double(), 0.3);
  EXPECT_TRUE(v->Find("breakdown")->Find("data")->is_null());
  EXPECT_DOUBLE_EQ(v->Find("whatif")->Find("stragglers")->as_double(), 1.4);
  ASSERT_NE(v->Find("whatif_kind"), nullptr);
  EXPECT_EQ(v->Find("whatif_kind")->Find("stragglers")->as_string(), "upper_bound");
  const json::Value::Array& findings = v->Find("findings")->as_array();
  ASSERT_EQ(findings.size(), 2u);
  EXPECT_EQ(findings[0].Find("kind")->as_string(), "straggler");
  EXPECT_EQ(findings[0].Find("rank")->as_int64(), 3);
  EXPECT_EQ(findings[0].Find("node")->as_string(), "node-0");
  EXPECT_EQ(findings[0].Find("gpu")->as_int64(), 3);
  EXPECT_EQ(findings[0].Find("cause")->as_string(), "thermal_throttling");
  EXPECT_EQ(findings[0].Find("since_step")->as_int64(), 40);
  EXPECT_EQ(findings[0].Find("until_step")->as_int64(), 199);
  EXPECT_EQ(findings[0].Find("severity")->as_string(), "warning");
  EXPECT_EQ(findings[1].Find("rank")->as_int64(), -1);
  EXPECT_EQ(findings[1].Find("until_step")->as_int64(), -1);
  EXPECT_TRUE(findings[1].Find("until_time")->is_null());

  v1::JobReport running = Finished();
  running.set_state("running");
  running.clear_end_reason();
  running.set_end_unix_nanos(0);
  running.clear_efficiency_ratio();
  running.clear_time_ratio();
  running.clear_whatif_speedup_ratio();
  running.clear_findings();
  v = json::Parse(ReportToJson(running));
  ASSERT_OK(v);
  EXPECT_TRUE(v->Find("efficiency_ratio")->is_null());
  EXPECT_TRUE(v->Find("breakdown")->is_null());
  EXPECT_TRUE(v->Find("whatif")->is_null());
  EXPECT_TRUE(v->Find("end_time")->is_null());
  EXPECT_TRUE(v->Find("end_reason")->is_null());
  EXPECT_TRUE(v->Find("findings")->as_array().empty());
}

TEST(ReportFormatTest, SectionsAndSectionFindings) {
  v1::JobReport r = Finished();
  r.add_section_names("forward");
  r.add_section_names("backward");
  r.set_sections_folded(4);
  r.mutable_findings(0)->mutable_evidence()->set_section("backward");
  r.mutable_findings(0)->mutable_evidence()->set_section_vs_reference_ratio(1.5);
  const std::string text = FormatReport(r);
  EXPECT_NE(text.find("\nSections (last known): forward, backward\n  4 section values not kept"),
            std::string::npos)
      << text;
  EXPECT_EQ(FormatReport(Finished()).find("Sections"), std::string::npos);

  absl::StatusOr<json::Value> v = json::Parse(ReportToJson(r));
  ASSERT_OK(v) << "\n" << ReportToJson(r);
  const json::Value::Array& names = v->Find("sections")->as_array();
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].as_string(), "forward");
  EXPECT_EQ(names[1].as_string(), "backward");
  EXPECT_EQ(v->Find("sections_folded")->as_int64(), 4);
  const json::Value::Array& findings = v->Find("findings")->as_array();
  EXPECT_EQ(findings[0].Find("section")->as_string(), "backward");
  EXPECT_DOUBLE_EQ(findings[0].Find("section_vs_reference_ratio")->as_double(), 1.5);
  EXPECT_TRUE(findings[1].Find("section")->is_null());
  EXPECT_TRUE(findings[1].Find("section_vs_reference_ratio")->is_null());

  v = json::Parse(ReportToJson(Finished()));
  ASSERT_OK(v);
  EXPECT_TRUE(v->Find("sections")->as_array().empty());
  EXPECT_EQ(v->Find("sections_folded")->as_int64(), 0);
  // The listing has them too.
  v1::ReportResponse listing;
  *listing.add_reports() = r;
  v = json::Parse(ReportListToJson(listing));
  ASSERT_OK(v);
  EXPECT_EQ(v->Find("reports")->as_array()[0].Find("sections")->as_array().size(), 2u);
}

TEST(ReportFormatTest, ListingShowsOneRowPerReport) {
  v1::ReportResponse list;
  v1::JobReport* a = list.add_reports();
  *a = Finished();
  a->clear_findings();
  v1::JobReport* b = list.add_reports();
  b->set_job("still-going");
  b->set_state("running");
  b->set_world_size(2);
  b->set_first_step(5);
  b->set_last_step(9);
  const std::string text = FormatReportList(list);
  EXPECT_NE(text.find("JOB"), std::string::npos) << text;
  EXPECT_NE(text.find("finished  8      0..199  2023-11-14 22:16:07 UTC  2"), std::string::npos)
      << text;
  EXPECT_NE(text.find("still-going"), std::string::npos) << text;
  EXPECT_EQ(FormatReportList(v1::ReportResponse()), "No job reports.\n");

  absl::StatusOr<json::Value> v = json::Parse(ReportListToJson(list));
  ASSERT_OK(v) << "\n" << ReportListToJson(list);
  const json::Value::Array& reports = v->Find("reports")->as_array();
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].Find("finding_count")->as_int64(), 2);
  EXPECT_EQ(reports[1].Find("state")->as_string(), "running");
  EXPECT_EQ(reports[0].Find("findings"), nullptr);
  v = json::Parse(ReportListToJson(v1::ReportResponse()));
  ASSERT_OK(v);
  EXPECT_TRUE(v->Find("reports")->as_array().empty());
}

TEST(ReportFormatTest, UnsavedAndPartialReportsSaySo) {
  v1::JobReport r = Finished();
  r.set_unsaved(true);
  v1::ReportGap* g = r.add_gaps();
  g->set_cause("collector_restart");
  g->set_after_step(80);
  g->set_before_step(96);
  g->set_from_unix_nanos(kT0 + 60 * kSecond);
  g->set_to_unix_nanos(kT0 + 70 * kSecond);
  v1::ReportGap* open = r.add_gaps();
  open->set_cause("collector_restart");
  open->set_after_step(150);
  open->set_before_step(-1);
  open->set_from_unix_nanos(kT0 + 100 * kSecond);
  const std::string text = FormatReport(r);
  EXPECT_NE(text.find("Not saved yet"), std::string::npos) << text;
  EXPECT_NE(text.find("--state-dir"), std::string::npos) << text;
  EXPECT_NE(text.find("steps 81..95 (15) are missing"), std::string::npos) << text;
  EXPECT_NE(text.find("after step 150"), std::string::npos) << text;
  EXPECT_NE(text.find("has not reported since"), std::string::npos) << text;

  absl::StatusOr<json::Value> v = json::Parse(ReportToJson(r));
  ASSERT_OK(v) << "\n" << ReportToJson(r);
  EXPECT_TRUE(v->Find("unsaved")->as_bool());
  EXPECT_TRUE(v->Find("partial")->as_bool());
  const json::Value::Array& gaps = v->Find("gaps")->as_array();
  ASSERT_EQ(gaps.size(), 2u);
  EXPECT_EQ(gaps[0].Find("after_step")->as_int64(), 80);
  EXPECT_EQ(gaps[0].Find("before_step")->as_int64(), 96);
  EXPECT_EQ(gaps[0].Find("missing_steps")->as_int64(), 15);
  EXPECT_EQ(gaps[0].Find("cause")->as_string(), "collector_restart");
  EXPECT_TRUE(gaps[1].Find("missing_steps")->is_null());
  EXPECT_TRUE(gaps[1].Find("to_time")->is_null());

  v1::ReportResponse list;
  *list.add_reports() = r;
  v1::JobReport* saved = list.add_reports();
  *saved = Finished();
  saved->set_job("whole");
  const std::string rows = FormatReportList(list);
  EXPECT_NE(rows.find("unsaved,partial"), std::string::npos) << rows;
  v = json::Parse(ReportListToJson(list));
  ASSERT_OK(v);
  EXPECT_TRUE(v->Find("reports")->as_array()[0].Find("unsaved")->as_bool());
  EXPECT_FALSE(v->Find("reports")->as_array()[1].Find("unsaved")->as_bool());
  EXPECT_FALSE(v->Find("reports")->as_array()[1].Find("partial")->as_bool());
  EXPECT_TRUE(v->Find("reports")->as_array()[1].Find("gaps")->as_array().empty());
}

}  // namespace
}  // namespace stepwatch::ctl
