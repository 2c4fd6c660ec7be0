// The HTML job report on synthetic reports: hostile names escaped, flagged rows and finding spans
// marked for machines, ranks beyond max_rank_rows behind their node and still reachable, nothing
// fetched from the network, and a page without a timeline that says so.
#include "ctl/report_html.h"

#include <string>

#include "absl/time/time.h"
#include "ctl/whatif_summary.h"
#include "gtest/gtest.h"

namespace stepwatch::ctl {
namespace {

constexpr char kHostile[] = "<script>alert(1)</script>\"'&";

std::string NodeName(int n) { return "node-" + std::to_string(n); }

// `ranks` ranks on nodes of `per_node` ranks, `columns` columns of 10 steps; `slow` computes 60%
// longer and is flagged from column `columns / 2` on.
v1::JobReport MakeReport(int ranks, int per_node, int columns, int slow) {
  v1::JobReport r;
  r.set_job("job-1");
  r.set_state("finished");
  r.set_end_reason("exited");
  r.set_world_size(ranks);
  r.set_first_step(0);
  r.set_last_step(columns * 10 - 1);
  r.set_start_unix_nanos(1'700'000'000'000'000'000);
  r.set_end_unix_nanos(r.start_unix_nanos() + 600'000'000'000);
  r.set_updated_unix_nanos(r.end_unix_nanos());
  r.set_step_seconds(0.165);
  r.set_efficiency_ratio(0.61);
  (*r.mutable_time_ratio())["compute"] = 0.61;
  (*r.mutable_whatif_speedup_ratio())["stragglers"] = 1.5;
  (*r.mutable_whatif_speedup_ratio())["overlap"] = 1.2;
  (*r.mutable_whatif_kind())["stragglers"] = "estimate";
  (*r.mutable_whatif_kind())["overlap"] = "upper_bound";
  r.set_finding_count(1);
  v1::Finding* f = r.add_findings();
  f->set_kind("straggler");
  f->set_rank(slow);
  f->set_node(NodeName(slow / per_node));
  f->set_gpu(slow % per_node);
  f->set_since_step(columns * 5);
  f->set_until_step(-1);
  f->set_severity("warning");
  f->set_cause("more_work");
  f->set_summary("rank is slow");
  f->set_action("look at rank");
  f->set_stage(-1);
  f->mutable_evidence()->set_busy_vs_median_ratio(1.6);
  v1::ReportTimeline* t = r.mutable_timeline();
  t->set_samples(columns);
  t->set_sample_interval_nanos(200'000'000);
  for (int c = 0; c < columns; ++c) {
    v1::TimelineColumn* col = t->add_columns();
    col->set_first_step(c * 10);
    col->set_last_step(c * 10 + 9);
    col->set_samples(1);
    col->set_step_seconds(0.165);
    col->set_efficiency_ratio(0.61);
    (*col->mutable_time_ratio())["compute"] = 0.61;
    (*col->mutable_time_ratio())["imbalance"] = 0.39;
  }
  for (int k = 0; k < ranks; ++k) {
    v1::RankSeries* s = t->add_ranks();
    s->set_rank(k);
    s->set_node(NodeName(k / per_node));
    s->set_gpu(k % per_node);
    s->set_pp_stage(-1);
    for (int c = 0; c < columns; ++c) {
      s->add_busy_seconds(k == slow ? 0.16f : 0.10f);
      s->add_flagged(k == slow && c >= columns / 2);
    }
  }
  for (int n = 0; n * per_node < ranks; ++n) {
    v1::NodeSeries* s = t->add_nodes();
    s->set_node(NodeName(n));
    s->set_ranks(per_node);
    for (int c = 0; c < columns; ++c) {
      s->add_busy_seconds(0.1f);
      s->add_gpu_utilization_ratio(0.9f);
      s->add_sm_active_ratio(0.8f);
    }
  }
  return r;
}

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

TEST(ReportHtmlTest, EscapesHostileJobAndNodeNames) {
  v1::JobReport r = MakeReport(4, 4, 10, 1);
  r.set_job(kHostile);
  r.mutable_timeline()->mutable_ranks(1)->set_node(kHostile);
  r.mutable_timeline()->mutable_nodes(0)->set_node(kHostile);
  r.mutable_findings(0)->set_node(kHostile);
  r.mutable_findings(0)->set_summary(kHostile);
  r.mutable_findings(0)->set_cause(kHostile);
  const std::string page = RenderReportHtml(r);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("\"'&\""), std::string::npos);
  EXPECT_NE(page.find("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;"), std::string::npos);
  EXPECT_EQ(EscapeHtml("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
}

TEST(ReportHtmlTest, MarksTheFlaggedRowAndNoOther) {
  const std::string page = RenderReportHtml(MakeReport(4, 4, 10, 1));
  EXPECT_EQ(Count(page, "data-flagged=\"true\""), 1);
  EXPECT_NE(page.find("data-rank=\"1\" data-node=\"node-0\" data-flagged=\"true\""),
            std::string::npos);
  for (int k : {0, 2, 3}) {
    EXPECT_NE(page.find("data-rank=\"" + std::to_string(k) +
                        "\" data-node=\"node-0\" data-flagged=\"false\""),
              std::string::npos)
        << k;
  }
  // The flagged stretch is outlined.
  EXPECT_NE(page.find("class=\"fl\" d=\"M"), std::string::npos);
}

TEST(ReportHtmlTest, FindingSpansCarryTheirSteps) {
  v1::JobReport r = MakeReport(4, 4, 10, 1);
  v1::Finding* cleared = r.add_findings();
  cleared->set_kind("slow_node");
  cleared->set_rank(-1);
  cleared->set_gpu(-1);
  cleared->set_stage(-1);
  cleared->set_node("node-0");
  cleared->set_since_step(12);
  cleared->set_until_step(40);
  const std::string page = RenderReportHtml(r);
  EXPECT_NE(page.find("data-finding=\"0\" data-kind=\"straggler\" data-since-step=\"50\" "
                      "data-until-step=\"-1\""),
            std::string::npos);
  EXPECT_NE(page.find("data-finding=\"1\" data-kind=\"slow_node\" data-since-step=\"12\" "
                      "data-until-step=\"40\""),
            std::string::npos);
  // Each table row is a link target for other pages.
  EXPECT_NE(page.find("<tr id=\"finding-0\""), std::string::npos);
  EXPECT_NE(page.find("<tr id=\"finding-1\""), std::string::npos);
  EXPECT_NE(page.find("href=\"#finding-1\""), std::string::npos);
  EXPECT_NE(page.find("busy_vs_median_ratio=1.6"), std::string::npos);
}

TEST(ReportHtmlTest, HeaderFiguresForMachines) {
  const std::string page = RenderReportHtml(MakeReport(4, 4, 10, 1));
  EXPECT_NE(page.find("id=\"efficiency\" data-value=\"0.61\""), std::string::npos);
  EXPECT_NE(page.find("id=\"steps\" data-value=\"100\""), std::string::npos);
  EXPECT_NE(page.find("id=\"world-size\" data-value=\"4\""), std::string::npos);
  // What-ifs: the best single fix, and all fixed together as explain and the text report say it.
  EXPECT_NE(page.find("id=\"whatif-best\" data-fix=\"stragglers\" data-value=\"1.5\""),
            std::string::npos);
  const v1::JobReport report = MakeReport(4, 4, 10, 1);
  const WhatIfSummary summary = SummarizeWhatIf(report.whatif_speedup_ratio(), report.time_ratio());
  const std::string key = "id=\"whatif-combined\" data-value=\"";
  const size_t at = page.find(key);
  ASSERT_NE(at, std::string::npos);
  EXPECT_NEAR(std::stod(page.substr(at + key.size(), 12)), summary.combined_speedup, 0.01);
  EXPECT_GT(summary.combined_speedup, 1.5);
}

TEST(ReportHtmlTest, ManyRanksAreGroupedByNodeAndEveryRankIsReachable) {
  const int ranks = 64;
  v1::JobReport r = MakeReport(ranks, 8, 20, 13);
  ReportHtmlOptions options;
  options.max_rank_rows = 16;
  const std::string page = RenderReportHtml(r, options);
  EXPECT_EQ(Count(page, "<details class=\"node\""), ranks / 8);
  // The slow rank's node is flagged, and its row opens to the rank.
  EXPECT_NE(page.find("<details class=\"node\" data-node=\"node-1\" data-flagged=\"true\">"),
            std::string::npos);
  EXPECT_NE(page.find("<details class=\"node\" data-node=\"node-0\" data-flagged=\"false\">"),
            std::string::npos);
  for (int k = 0; k < ranks; ++k) {
    EXPECT_NE(page.find("data-rank=\"" + std::to_string(k) + "\""), std::string::npos) << k;
  }
  // Rank 13 sits inside node-1's <details>.
  const size_t node1 = page.find("<details class=\"node\" data-node=\"node-1\"");
  const size_t rank13 = page.find("data-rank=\"13\"");
  EXPECT_LT(node1, rank13);
  EXPECT_LT(rank13, page.find("</details>", node1));
  // Under the limit: one row per rank, no node rows.
  EXPECT_EQ(Count(RenderReportHtml(r), "<details class=\"node\""), 0);
}

TEST(ReportHtmlTest, SelfContained) {
  v1::JobReport r = MakeReport(8, 4, 10, 1);
  r.mutable_timeline()->add_section_names("forward");
  for (v1::RankSeries& s : *r.mutable_timeline()->mutable_ranks()) {
    for (int c = 0; c < 10; ++c) s.add_section_seconds(0.05f);
  }
  ReportHtmlOptions options;
  options.refresh = absl::Seconds(5);
  options.site_root = "/";
  const std::string page = RenderReportHtml(r, options);
  EXPECT_EQ(page.find("http://"), std::string::npos);
  EXPECT_EQ(page.find("https://"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("<link"), std::string::npos);
  EXPECT_EQ(page.find("@import"), std::string::npos);
  EXPECT_NE(page.find("data-section=\"forward\""), std::string::npos);
  EXPECT_NE(page.find("http-equiv=\"refresh\" content=\"5\""), std::string::npos);
  EXPECT_NE(page.find("prefers-color-scheme:dark"), std::string::npos);
}

TEST(ReportHtmlTest, EmptyTimelineSaysThereIsNone) {
  v1::JobReport r = MakeReport(4, 4, 10, 1);
  r.clear_timeline();
  const std::string page = RenderReportHtml(r);
  EXPECT_NE(page.find("id=\"no-timeline\""), std::string::npos);
  EXPECT_NE(page.find("There is no timeline in this report"), std::string::npos);
  EXPECT_EQ(page.find("id=\"heatmap\""), std::string::npos);
  // The findings are still drawn and listed.
  EXPECT_NE(page.find("data-kind=\"straggler\" data-since-step=\"50\""), std::string::npos);
  EXPECT_NE(page.find("</html>"), std::string::npos);
  // A report with nothing at all still renders a whole page.
  const std::string bare = RenderReportHtml(v1::JobReport());
  EXPECT_NE(bare.find("id=\"no-timeline\""), std::string::npos);
  EXPECT_NE(bare.find("</html>"), std::string::npos);
}

TEST(ReportHtmlTest, ThousandRanksStayAFewMegabytes) {
  v1::JobReport r = MakeReport(1024, 8, 100, 100);
  // Noisy values: no two neighbouring cells share a colour by luck of equal inputs.
  for (v1::RankSeries& s : *r.mutable_timeline()->mutable_ranks()) {
    for (int c = 0; c < s.busy_seconds_size(); ++c) {
      s.set_busy_seconds(c,
                         0.1f * (1.0f + 0.07f * static_cast<float>((s.rank() * 7 + c * 3) % 11)));
    }
  }
  const std::string page = RenderReportHtml(r);
  EXPECT_LT(page.size(), 4u << 20);
  EXPECT_EQ(Count(page, "<details class=\"node\""), 128);
}

}  // namespace
}  // namespace stepwatch::ctl
