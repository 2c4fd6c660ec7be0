#include "ctl/format.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

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
  }
  v1::Finding* f = e.add_findings();
  f->set_kind("straggler");
  f->set_severity("warning");
  f->set_since_step(450);
  f->set_summary(absl::StrCat("rank ", straggler, " slow"));
  return e;
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

TEST(FormatTest, JsonUsesProtoFieldNamesAndPrintsDefaults) {
  absl::StatusOr<std::string> json = ToJson(SampleStatus());
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"world_size\": 64"), std::string::npos) << *json;
  EXPECT_NE(json->find("\"steps_per_second\""), std::string::npos) << *json;
  json = ToJson(v1::FindingsResponse());
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"findings\": []"), std::string::npos) << *json;
}

}  // namespace
}  // namespace stepwatch::ctl
