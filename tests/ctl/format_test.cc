#include "ctl/format.h"

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json.h"
#include "ctl/proto_json.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::ctl {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Number of display cells of a bar: full blocks count 1, the trailing partial block counts 1.
int BarCells(const std::string& bar) {
  int cells = 0;
  for (unsigned char c : bar) {
    if ((c & 0xC0) != 0x80) ++cells;  // count UTF-8 lead bytes
  }
  return cells;
}

TEST(FormatTest, Durations) {
  EXPECT_EQ(FormatDuration(0.1234), "123.4 ms");
  EXPECT_EQ(FormatDuration(2.5), "2.50 s");
  EXPECT_EQ(FormatDuration(0.00085), "850 us");
  EXPECT_EQ(FormatDuration(0), "0");
  EXPECT_EQ(FormatDuration(-1), "-");
  EXPECT_EQ(FormatPercent(0.784), "78%");
}

TEST(FormatTest, BarsScaleWithEighthCells) {
  EXPECT_EQ(Bar(1.0, 4), "████");
  EXPECT_EQ(Bar(0.5, 4), "██");
  EXPECT_EQ(Bar(0.0, 4), "");
  EXPECT_EQ(Bar(2.0, 4), "████");  // clamped
  EXPECT_EQ(Bar(1.0 / 32, 4), "▏");
  EXPECT_EQ(Bar(0.5 + 3.0 / 32, 4), "██▍");
  EXPECT_LT(BarCells(Bar(0.3, 20)), BarCells(Bar(0.6, 20)));
}

TEST(FormatTest, TableAlignsColumns) {
  std::string t = FormatTable({{"A", "BB", "C"}, {"long", "x", "tail"}});
  std::vector<std::string> lines = Lines(t);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "A     BB  C");
  EXPECT_EQ(lines[1], "long  x   tail");
}

v1::StatusResponse SampleStatus() {
  v1::StatusResponse s;
  v1::JobStatus* j = s.add_jobs();
  j->set_job("resnet50");
  j->set_world_size(64);
  j->set_ranks_reporting(64);
  j->set_last_step(1234);
  j->set_step_seconds(0.1023);
  j->set_steps_per_second(9.78);
  j->set_samples_per_second(20000);
  j->set_efficiency_ratio(0.81);
  j->set_finding_count(2);
  v1::NodeStatus* n = s.add_nodes();
  n->set_node("node-3");
  n->set_last_seen_unix_nanos(1'000'000'000);
  n->set_nvml_available(true);
  n->set_cpu_utilization_ratio(0.35);
  for (int i = 0; i < 2; ++i) {
    v1::GpuStatus* g = n->add_gpus();
    g->set_index(i);
    g->set_utilization_gpu_ratio(i == 0 ? 0.98 : 0.41);
  }
  v1::NodeStatus* cpu_only = s.add_nodes();
  cpu_only->set_node("cpu-node");
  cpu_only->set_nvml_available(false);
  cpu_only->set_nvml_error("libnvidia-ml.so.1 not found");
  cpu_only->set_last_seen_unix_nanos(1'000'000'000);
  return s;
}

TEST(FormatTest, StatusShowsJobsAndNodes) {
  std::string out = FormatStatus(SampleStatus(), 3'500'000'000);
  std::vector<std::string> lines = Lines(out);
  ASSERT_GE(lines.size(), 6u) << out;
  EXPECT_NE(lines[0].find("JOB"), std::string::npos);
  EXPECT_NE(lines[0].find("STEP TIME"), std::string::npos);
  for (const char* cell : {"resnet50", "64", "1234", "102.3 ms", "9.78", "20000", "81%"}) {
    EXPECT_NE(lines[1].find(cell), std::string::npos) << cell << " in " << lines[1];
  }
  EXPECT_NE(out.find("0:98% 1:41%"), std::string::npos) << out;
  EXPECT_NE(out.find("2.5s ago"), std::string::npos) << out;
  EXPECT_NE(out.find("no NVML (libnvidia-ml.so.1 not found)"), std::string::npos) << out;
}

TEST(FormatTest, EmptyStatusSaysSo) {
  std::string out = FormatStatus(v1::StatusResponse(), 0);
  EXPECT_NE(out.find("No jobs reporting."), std::string::npos);
  EXPECT_NE(out.find("No nodes reporting."), std::string::npos);
}

TEST(FormatTest, FindingsTable) {
  v1::FindingsResponse r;
  EXPECT_EQ(FormatFindings(r), "No active findings.\n");
  v1::Finding* f = r.add_findings();
  f->set_kind("straggler");
  f->set_job("resnet50");
  f->set_rank(13);
  f->set_node("node-2");
  f->set_gpu(5);
  f->set_since_step(1200);
  f->set_severity("warning");
  f->set_persistent(true);
  f->set_summary("rank 13 on node-2 GPU 5: compute +31% vs median");
  v1::Finding* idle = r.add_findings();
  idle->set_kind("idle_gpu");
  idle->set_rank(-1);
  idle->set_gpu(3);
  idle->set_node("node-4");
  idle->set_severity("info");
  std::vector<std::string> lines = Lines(FormatFindings(r));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[1].find("straggler"), std::string::npos);
  EXPECT_NE(lines[1].find("rank 13 on node-2 GPU 5: compute +31% vs median"), std::string::npos);
  EXPECT_NE(lines[2].find("idle_gpu"), std::string::npos);
  EXPECT_NE(lines[2].find("(transient)"), std::string::npos);
}

v1::ExplainResponse SampleExplain(int ranks, int straggler) {
  v1::ExplainResponse e;
  v1::JobStatus* j = e.mutable_job();
  j->set_job("llm");
  j->set_world_size(ranks);
  j->set_ranks_reporting(ranks);
  j->set_last_step(500);
  j->set_step_seconds(0.2);
  j->set_steps_per_second(5);
  j->set_efficiency_ratio(0.7);
  (*e.mutable_time_ratio())["compute"] = 0.6;
  (*e.mutable_time_ratio())["imbalance"] = 0.25;
  (*e.mutable_time_ratio())["comm"] = 0.1;
  (*e.mutable_time_ratio())["data"] = 0.05;
  (*e.mutable_time_ratio())["other"] = 0;
  (*e.mutable_whatif_speedup_ratio())["stragglers"] = 1.33;
  (*e.mutable_whatif_speedup_ratio())["overlap"] = 1.1;
  (*e.mutable_whatif_speedup_ratio())["data"] = 1.05;
  e.set_scaling_efficiency_ratio(0.625);
  for (int r = 0; r < ranks; ++r) {
    v1::RankRow* row = e.add_ranks();
    row->set_rank(r);
    row->set_node(absl::StrCat("node-", r / 8));
    row->set_gpu(r % 8);
    const double busy = r == straggler ? 0.19 : 0.12 + 0.0001 * r;
    row->set_busy_seconds(busy);
    row->set_compute_seconds(busy);
    row->set_comm_seconds(0.2 - busy);
    row->set_busy_vs_median_ratio(busy / 0.12);
    row->set_straggler(r == straggler);
    row->set_comparable(true);
  }
  v1::Finding* f = e.add_findings();
  f->set_kind("straggler");
  f->set_severity("warning");
  f->set_since_step(450);
  f->set_summary(absl::StrCat("rank ", straggler, " slow"));
  return e;
}

TEST(FormatTest, ExplainShowsTheEvidenceOfAFinding) {
  v1::ExplainResponse e = SampleExplain(8, 6);
  v1::FindingEvidence* ev = e.mutable_findings(0)->mutable_evidence();
  ev->set_compute_vs_median_ratio(1.31);
  ev->add_exited_ranks(3);
  ev->add_exited_ranks(7);
  v1::DeviceEvidence* d = ev->add_devices();
  d->set_rank(6);
  d->set_node("node-0");
  d->set_gpu(6);
  d->set_sm_clock_mhz(1410);
  d->set_throttle_reasons(0x20);
  v1::DeviceEvidence* host = ev->add_devices();
  host->set_rank(-1);
  host->set_node("node-0");
  host->set_gpu(-1);
  std::string out = FormatExplain(e);
  EXPECT_NE(out.find("      evidence: compute_vs_median_ratio=1.31 exited_ranks=3,7\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("      device node-0 GPU 6 (rank 6): sm_clock_mhz=1410 "
                     "throttle_reasons=0x20\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("      device node-0:"), std::string::npos) << "a device without figures";
  // A finding without evidence gets no evidence line.
  EXPECT_EQ(FormatExplain(SampleExplain(8, 6)).find("evidence:"), std::string::npos);
}

TEST(FormatTest, ExplainMarksTheStragglerWithTheLongestBar) {
  std::string out = FormatExplain(SampleExplain(8, 6));
  EXPECT_NE(out.find("Job llm: 8 ranks"), std::string::npos) << out;
  EXPECT_NE(out.find("Scaling efficiency (per-GPU throughput vs smaller runs): 62%"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("imbalance   25.0%"), std::string::npos) << out;
  EXPECT_NE(out.find("1.33x faster"), std::string::npos) << out;
  EXPECT_NE(out.find("[warning] straggler since step 450: rank 6 slow"), std::string::npos);
  int flagged = 0;
  int straggler_cells = 0;
  int max_other_cells = 0;
  for (const std::string& line : Lines(out)) {
    if (line.rfind("!  6 ", 0) == 0) {
      ++flagged;
      straggler_cells = BarCells(line.substr(line.rfind("  ") + 2));
      EXPECT_NE(line.find("+58%"), std::string::npos) << line;
    } else if (line.rfind("   ", 0) == 0 && line.find("node-0") != std::string::npos) {
      max_other_cells = std::max(max_other_cells, BarCells(line.substr(line.rfind("  ") + 2)));
    }
  }
  EXPECT_EQ(flagged, 1) << out;
  EXPECT_EQ(straggler_cells, 24);  // the longest busy time fills the bar
  EXPECT_GT(max_other_cells, 0);
  EXPECT_LT(max_other_cells, straggler_cells - 6) << out;
}

TEST(FormatTest, ExplainOfAHugeJobKeepsFlaggedAndSlowestRanks) {
  ExplainFormatOptions o;
  o.max_rank_rows = 5;
  std::string out = FormatExplain(SampleExplain(100, 3), o);
  EXPECT_NE(out.find("!  3 "), std::string::npos) << out;
  EXPECT_NE(out.find("  99 "), std::string::npos) << out;  // slowest unflagged
  EXPECT_EQ(out.find("  50 "), std::string::npos) << out;
  EXPECT_NE(out.find("95 more ranks closer to the median not shown"), std::string::npos) << out;
}

// Line number (0-based) of the first line containing `needle`, or -1.
int LineOf(const std::string& text, const std::string& needle) {
  std::vector<std::string> lines = Lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find(needle) != std::string::npos) return static_cast<int>(i);
  }
  return -1;
}

TEST(FormatTest, ExplainRanksWhatIfsLargestFirst) {
  v1::ExplainResponse e = SampleExplain(8, 6);
  (*e.mutable_whatif_speedup_ratio())["stragglers"] = 1.04;
  (*e.mutable_whatif_speedup_ratio())["overlap"] = 1.2;
  (*e.mutable_whatif_speedup_ratio())["data"] = 1.5;
  std::string out = FormatExplain(e);
  const int data = LineOf(out, "no data-loading stall");
  const int overlap = LineOf(out, "communication fully overlapped");
  const int stragglers = LineOf(out, "stragglers fixed");
  ASSERT_GE(data, 0) << out;
  EXPECT_LT(data, overlap) << out;
  EXPECT_LT(overlap, stragglers) << out;
  EXPECT_NE(out.find("Best single fix: no data-loading stall (1.50x faster)"), std::string::npos)
      << out;
  // The overlap what-if assumes all communication can hide: an upper bound.
  std::vector<std::string> lines = Lines(out);
  EXPECT_NE(lines[overlap].find("upper bound"), std::string::npos) << out;
  EXPECT_EQ(lines[data].find("upper bound"), std::string::npos) << out;
}

TEST(FormatTest, ExplainSaysWhichWhatIfsAreBounds) {
  v1::ExplainResponse e = SampleExplain(8, 6);
  auto& wi = *e.mutable_whatif_speedup_ratio();
  auto& kind = *e.mutable_whatif_kind();
  wi["stragglers"] = 1.3;
  kind["stragglers"] = "upper_bound";  // a pipeline job: step events do not show its schedule
  wi["overlap"] = 1.2;
  kind["overlap"] = "upper_bound";
  wi["data"] = 1.1;
  kind["data"] = "lower_bound";
  wi["pipeline"] = 1.15;
  kind["pipeline"] = "upper_bound";
  const std::string out = FormatExplain(e);
  const std::vector<std::string> lines = Lines(out);
  const int stragglers = LineOf(out, "stragglers fixed");
  const int data = LineOf(out, "no data-loading stall");
  const int pipeline = LineOf(out, "pipeline stages balanced");
  ASSERT_GE(stragglers, 0) << out;
  ASSERT_GE(data, 0) << out;
  ASSERT_GE(pipeline, 0) << out;
  EXPECT_NE(lines[stragglers].find("(upper bound)"), std::string::npos) << out;
  EXPECT_NE(lines[data].find("(lower bound)"), std::string::npos) << out;
  EXPECT_NE(lines[pipeline].find("1.15x faster"), std::string::npos) << out;
  // An estimate says nothing more.
  kind["stragglers"] = "estimate";
  const std::string estimate = FormatExplain(e);
  EXPECT_EQ(Lines(estimate)[LineOf(estimate, "stragglers fixed")].find("bound"), std::string::npos)
      << estimate;
}

TEST(FormatTest, ExplainCombinesTheRemovedShares) {
  v1::ExplainResponse e = SampleExplain(8, 6);  // compute 60%: at most 40% can go
  const double s1 = 1.33, s2 = 1.1, s3 = 1.05;
  const double removed = (1 - 1 / s1) + (1 - 1 / s2) + (1 - 1 / s3);
  WhatIfSummary summary = SummarizeWhatIf(e);
  EXPECT_NEAR(summary.best_speedup, 1.33, 1e-9);
  EXPECT_NEAR(summary.combined_speedup, 1 / (1 - removed), 1e-9);
  EXPECT_GT(summary.combined_speedup, s1 * 1.2);  // more than the best alone
  EXPECT_FALSE(summary.combined_clamped);
  EXPECT_TRUE(summary.combined_is_upper_bound);
  std::string out = FormatExplain(e);
  EXPECT_NE(
      out.find(absl::StrFormat("All fixed together: up to %.2fx faster", summary.combined_speedup)),
      std::string::npos)
      << out;

  // Without the overlap what-if the combined gain is an estimate, not a bound.
  e.mutable_whatif_speedup_ratio()->erase("overlap");
  summary = SummarizeWhatIf(e);
  EXPECT_FALSE(summary.combined_is_upper_bound);
  EXPECT_NEAR(summary.combined_speedup, 1 / ((1 / s1) + (1 / s3) - 1), 1e-9);
}

TEST(FormatTest, ExplainClampsTheCombinedGain) {
  v1::ExplainResponse e;
  (*e.mutable_whatif_speedup_ratio())["stragglers"] = 10;
  (*e.mutable_whatif_speedup_ratio())["data"] = 10;  // 90% + 90% of the step cannot both go
  WhatIfSummary summary = SummarizeWhatIf(e);
  EXPECT_TRUE(summary.combined_clamped);
  EXPECT_TRUE(std::isfinite(summary.combined_speedup));
  EXPECT_NEAR(summary.combined_speedup, 20, 1e-9);  // 5% of the step always remains
  // With a known compute share, that share remains.
  (*e.mutable_time_ratio())["compute"] = 0.5;
  summary = SummarizeWhatIf(e);
  EXPECT_TRUE(summary.combined_clamped);
  EXPECT_NEAR(summary.combined_speedup, 10, 1e-9);  // never below the best single fix
  (*e.mutable_time_ratio())["compute"] = 0.02;
  (*e.mutable_whatif_speedup_ratio())["data"] = 1;
  summary = SummarizeWhatIf(e);
  EXPECT_FALSE(summary.combined_clamped);
  EXPECT_NEAR(summary.combined_speedup, 10, 1e-9);
}

TEST(FormatTest, ExplainOfUnknownBreakdownSaysSoInsteadOfAllCompute) {
  v1::ExplainResponse e = SampleExplain(4, -1);
  e.clear_time_ratio();
  e.clear_whatif_speedup_ratio();
  for (v1::RankRow& r : *e.mutable_ranks()) r.set_comparable(false);
  std::string out = FormatExplain(e);
  EXPECT_EQ(out.find("100.0%"), std::string::npos) << out;
  EXPECT_EQ(out.find("0.0%"), std::string::npos) << out;
  EXPECT_NE(out.find("ranks report only their step time"), std::string::npos) << out;
  std::vector<std::string> lines = Lines(out);
  const int compute = LineOf(out, "  compute");
  ASSERT_GE(compute, 0) << out;
  EXPECT_NE(lines[compute].find("-"), std::string::npos) << out;
  EXPECT_EQ(out.find("Best single fix"), std::string::npos) << out;
  // Ranks that cannot be compared show "-", not "+0%".
  EXPECT_EQ(out.find("+0%"), std::string::npos) << out;
  int rank_rows = 0;
  for (const std::string& line : lines) {
    if (line.find("node-0") == std::string::npos) continue;
    ++rank_rows;
    std::istringstream words(line);
    std::vector<std::string> cells;
    for (std::string w; words >> w;) cells.push_back(w);
    ASSERT_GE(cells.size(), 2u) << line;
    EXPECT_EQ(cells[cells.size() - 2], "-") << line;  // VS MEDIAN, before the bar
  }
  EXPECT_EQ(rank_rows, 4) << out;

  // A breakdown of all zeros with what-ifs of 1 (nothing known) reads the same.
  for (const char* c : {"compute", "imbalance", "comm", "data", "other"}) {
    (*e.mutable_time_ratio())[c] = 0;
  }
  for (const char* fix : {"stragglers", "overlap", "data"}) {
    (*e.mutable_whatif_speedup_ratio())[fix] = 1;
  }
  const std::string zeros = FormatExplain(e);
  EXPECT_NE(zeros.find("ranks report only their step time"), std::string::npos) << zeros;
  EXPECT_EQ(zeros.find("0.0%"), std::string::npos) << zeros;
  EXPECT_EQ(zeros.find("1.00x faster"), std::string::npos) << zeros;
}

TEST(FormatTest, ExplainShowsEachFindingsCauseAndAction) {
  v1::ExplainResponse e = SampleExplain(8, 6);
  e.mutable_findings(0)->set_cause("thermal_throttle");
  e.mutable_findings(0)->set_action("check the cooling of node-0 GPU 6");
  std::string out = FormatExplain(e);
  const int finding = LineOf(out, "[warning] straggler since step 450");
  ASSERT_GE(finding, 0) << out;
  EXPECT_EQ(LineOf(out, "cause: thermal_throttle"), finding + 1) << out;
  EXPECT_EQ(LineOf(out, "action: check the cooling of node-0 GPU 6"), finding + 2) << out;
}

// A job with named sections: one column per section, each rank against the median rank, the
// section straggler marked; the finding's section shows in its evidence; --json carries it all.
v1::ExplainResponse SectionExplain() {
  v1::ExplainResponse e = SampleExplain(4, 2);
  e.mutable_job()->add_section_names("forward");
  e.mutable_job()->add_section_names("backward");
  for (v1::RankRow& row : *e.mutable_ranks()) {
    v1::SectionMedian* fwd = row.add_sections();
    fwd->set_name("forward");
    fwd->set_seconds(0.010);
    v1::SectionMedian* bwd = row.add_sections();
    bwd->set_name("backward");
    bwd->set_seconds(row.rank() == 2 ? 0.030 : 0.020);
  }
  v1::FindingEvidence* ev = e.mutable_findings(0)->mutable_evidence();
  ev->set_section("backward");
  ev->set_section_vs_reference_ratio(1.5);
  return e;
}

TEST(FormatTest, ExplainShowsPerRankSectionMedians) {
  const std::string out = FormatExplain(SectionExplain());
  const int header = LineOf(out, "Sections (per rank: median over recent steps");
  ASSERT_GE(header, 0) << out;
  const std::vector<std::string> lines = Lines(out);
  EXPECT_EQ(lines[header + 1], "   RANK  forward        backward") << out;
  EXPECT_EQ(lines[header + 2], "   0     10.0 ms (+0%)  20.0 ms (+0%)") << out;
  EXPECT_EQ(lines[header + 4], "!  2     10.0 ms (+0%)  30.0 ms (+50%)") << out;
  EXPECT_GT(header, LineOf(out, "Ranks (medians over recent steps"));
  EXPECT_LT(header, LineOf(out, "Findings"));
  EXPECT_NE(out.find("evidence: section=backward section_vs_reference_ratio=1.5\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("not kept"), std::string::npos) << out;

  // Later names folded: said under the table. A rank without a section reads "-".
  v1::ExplainResponse folded = SectionExplain();
  folded.mutable_job()->set_sections_folded(12);
  folded.mutable_ranks(1)->mutable_sections()->RemoveLast();
  const std::string text = FormatExplain(folded);
  EXPECT_NE(text.find("  12 section values not kept: a job keeps its first 16 section names\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("   1     10.0 ms (+0%)  -\n"), std::string::npos) << text;

  // Without sections, no such block.
  EXPECT_EQ(FormatExplain(SampleExplain(4, 2)).find("Sections"), std::string::npos);
}

// Steps analysed without some ranks are said under the job's line; a complete job says nothing.
TEST(FormatTest, ExplainSaysWhenStepsWereAnalysedWithoutEveryRank) {
  EXPECT_EQ(FormatExplain(SampleExplain(4, 2)).find("Incomplete"), std::string::npos);
  v1::ExplainResponse e = SampleExplain(4, 2);
  e.mutable_job()->set_incomplete_steps(7);
  e.mutable_job()->set_late_samples(21);
  const std::string out = FormatExplain(e);
  EXPECT_NE(out.find("Incomplete: 7 steps analysed without every rank, 21 rank samples came after "
                     "their step was analysed"),
            std::string::npos)
      << out;
  EXPECT_LT(LineOf(out, "Incomplete:"), LineOf(out, "Where the step time goes"));
}

TEST(FormatTest, ExplainJsonCarriesSections) {
  absl::StatusOr<std::string> json = ToJson(SectionExplain());
  ASSERT_OK(json);
  for (const char* needle : {"\"section_names\": [\n   \"forward\",", "\"sections_folded\": 0",
                             "\"name\": \"backward\",\n     \"seconds\": 0.03",
                             "\"section\": \"backward\"", "\"section_vs_reference_ratio\": 1.5"}) {
    EXPECT_NE(json->find(needle), std::string::npos) << needle << "\n" << *json;
  }
}

TEST(FormatTest, JsonUsesProtoFieldNamesAndPrintsDefaults) {
  absl::StatusOr<std::string> json = ToJson(SampleStatus());
  ASSERT_OK(json);
  EXPECT_NE(json->find("\"world_size\": 64"), std::string::npos) << *json;
  EXPECT_NE(json->find("\"steps_per_second\""), std::string::npos) << *json;
  json = ToJson(v1::FindingsResponse());
  ASSERT_OK(json);
  EXPECT_NE(json->find("\"findings\": []"), std::string::npos) << *json;
}

// 64-bit integers are JSON numbers, as in report --json (proto3 JSON would quote them), in
// messages, repeated fields and nested messages; strings that look like numbers stay strings.
TEST(FormatTest, JsonPrints64BitIntegersAsNumbers) {
  v1::StatusResponse status = SampleStatus();
  ASSERT_GT(status.jobs_size(), 0);
  status.mutable_jobs(0)->set_last_step(1234567890123);
  status.mutable_jobs(0)->set_last_seen_unix_nanos(1764600000123456789);
  status.mutable_jobs(0)->set_job("4711");
  absl::StatusOr<std::string> out = ToJson(status);
  ASSERT_OK(out);
  absl::StatusOr<json::Value> v = json::Parse(*out);
  ASSERT_OK(v) << "\n" << *out;
  const json::Value& job = v->Find("jobs")->as_array()[0];
  ASSERT_TRUE(job.Find("last_step")->is_number()) << *out;
  EXPECT_EQ(job.Find("last_step")->as_int64(), 1234567890123);
  ASSERT_TRUE(job.Find("last_seen_unix_nanos")->is_number()) << *out;
  EXPECT_EQ(job.Find("last_seen_unix_nanos")->as_int64(), 1764600000123456789);
  EXPECT_TRUE(job.Find("job")->is_string());
  EXPECT_EQ(job.Find("job")->as_string(), "4711");
  EXPECT_TRUE(job.Find("world_size")->is_number());
  // No 64-bit field anywhere is left quoted.
  EXPECT_EQ(out->find("\"last_step\": \""), std::string::npos) << *out;

  v1::FindingsResponse findings;
  v1::Finding* f = findings.add_findings();
  f->set_since_step(77);
  f->set_since_unix_nanos(1764600000000000001);
  f->set_summary("123");
  out = ToJson(findings);
  ASSERT_OK(out);
  v = json::Parse(*out);
  ASSERT_OK(v) << "\n" << *out;
  const json::Value& fj = v->Find("findings")->as_array()[0];
  EXPECT_TRUE(fj.Find("since_step")->is_number()) << *out;
  EXPECT_EQ(fj.Find("since_unix_nanos")->as_int64(), 1764600000000000001);
  EXPECT_TRUE(fj.Find("summary")->is_string()) << *out;
}

// Kubernetes attribution: POD (NAMESPACE/POD) and CONTAINER columns appear before the summary
// once a finding names a pod, and not at all off Kubernetes.
TEST(FormatTest, FindingsShowTheirPodOnlyWhenOneIsKnown) {
  v1::FindingsResponse r;
  v1::Finding* f = r.add_findings();
  f->set_severity("warning");
  f->set_kind("straggler");
  f->set_job("llm");
  f->set_rank(2);
  f->set_node("node-0");
  f->set_gpu(2);
  f->set_cause("unknown");
  f->set_summary("rank 2 slow");
  v1::Finding* g = r.add_findings();
  *g = *f;
  g->set_rank(3);
  const std::string plain = FormatFindings(r);
  EXPECT_EQ(plain.find("POD"), std::string::npos) << plain;
  f->mutable_kubernetes_pod()->set_namespace_("team-y");
  f->mutable_kubernetes_pod()->set_pod("train-x");
  f->mutable_kubernetes_pod()->set_container("trainer");
  const std::vector<std::string> lines = Lines(FormatFindings(r));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_LT(lines[0].find("POD"), lines[0].find("CONTAINER"));
  EXPECT_LT(lines[0].find("CONTAINER"), lines[0].find("SUMMARY"));
  EXPECT_NE(lines[1].find("team-y/train-x"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("trainer"), std::string::npos) << lines[1];
  // A finding in no pod reads "-" in both columns, its summary still last.
  const size_t summary = lines[2].rfind("rank 2 slow");
  ASSERT_NE(summary, std::string::npos) << lines[2];
  EXPECT_EQ(summary + 11, lines[2].size()) << lines[2];
  EXPECT_NE(lines[2].substr(0, summary).find("unknown  -"), std::string::npos) << lines[2];
}

}  // namespace
}  // namespace stepwatch::ctl
