// Writes the HTML job report of a synthetic job (RANKS ranks, 8 per node, COLUMNS timeline
// columns, noisy busy times, a straggler and a slow node) to FILE, and prints its size: the page
// bench_report_html.py opens in Chromium to time how long a large report takes to render.
// Usage: report_html_page FILE [RANKS [COLUMNS]]
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <string>

#include "ctl/report_html.h"

namespace {

namespace v1 = stepwatch::v1;

std::string NodeName(int n) { return "node-" + std::to_string(n); }

v1::JobReport SyntheticReport(int ranks, int columns) {
  constexpr int kPerNode = 8;
  const int slow_rank = ranks / 3;
  const int slow_node = ranks / kPerNode / 2;
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(1.0f, 0.04f);
  v1::JobReport r;
  r.set_job("synthetic-" + std::to_string(ranks));
  r.set_state("finished");
  r.set_end_reason("exited");
  r.set_world_size(ranks);
  r.set_first_step(0);
  r.set_last_step(columns * 50 - 1);
  r.set_start_unix_nanos(1'760'000'000'000'000'000);
  r.set_end_unix_nanos(r.start_unix_nanos() + 3'600'000'000'000);
  r.set_updated_unix_nanos(r.end_unix_nanos());
  r.set_step_seconds(0.72);
  r.set_efficiency_ratio(0.74);
  (*r.mutable_whatif_speedup_ratio())["stragglers"] = 1.21;
  (*r.mutable_whatif_speedup_ratio())["overlap"] = 1.08;
  (*r.mutable_whatif_speedup_ratio())["data"] = 1.02;
  (*r.mutable_whatif_kind())["stragglers"] = "estimate";
  (*r.mutable_whatif_kind())["overlap"] = "upper_bound";
  (*r.mutable_whatif_kind())["data"] = "estimate";
  v1::Finding* f = r.add_findings();
  f->set_kind("straggler");
  f->set_rank(slow_rank);
  f->set_node(NodeName(slow_rank / kPerNode));
  f->set_gpu(slow_rank % kPerNode);
  f->set_stage(-1);
  f->set_since_step(columns * 20);
  f->set_until_step(-1);
  f->set_severity("warning");
  f->set_cause("thermal_throttling");
  f->set_summary("rank " + std::to_string(slow_rank) + ": compute +35% vs median");
  f->set_action("check the GPU's cooling");
  f->mutable_evidence()->set_busy_vs_median_ratio(1.35);
  f = r.add_findings();
  f->set_kind("slow_node");
  f->set_rank(-1);
  f->set_gpu(-1);
  f->set_stage(-1);
  f->set_node(NodeName(slow_node));
  f->set_since_step(columns * 10);
  f->set_until_step(columns * 30);
  f->set_severity("warning");
  f->set_cause("host_cpu");
  f->set_summary(NodeName(slow_node) + ": every rank +18%");
  r.set_finding_count(r.findings_size());
  v1::ReportTimeline* t = r.mutable_timeline();
  t->set_sample_interval_nanos(4'000'000'000);
  for (int c = 0; c < columns; ++c) {
    v1::TimelineColumn* col = t->add_columns();
    col->set_first_step(c * 50);
    col->set_last_step(c * 50 + 49);
    col->set_samples(9);
    col->set_step_seconds(0.7 * noise(rng));
    (*col->mutable_time_ratio())["compute"] = 0.74;
    (*col->mutable_time_ratio())["imbalance"] = 0.12;
    (*col->mutable_time_ratio())["comm"] = 0.1;
    (*col->mutable_time_ratio())["data"] = 0.02;
    (*col->mutable_time_ratio())["other"] = 0.02;
  }
  t->set_samples(columns * 9);
  for (int k = 0; k < ranks; ++k) {
    v1::RankSeries* s = t->add_ranks();
    s->set_rank(k);
    s->set_node(NodeName(k / kPerNode));
    s->set_gpu(k % kPerNode);
    s->set_pp_stage(-1);
    for (int c = 0; c < columns; ++c) {
      const bool slow = (k == slow_rank && c >= columns / 5) ||
                        (k / kPerNode == slow_node && c >= columns / 10 && c < columns * 3 / 10);
      s->add_busy_seconds(0.5f * noise(rng) * (slow ? 1.35f : 1.0f));
      s->add_flagged(slow);
    }
  }
  for (int n = 0; n * kPerNode < ranks; ++n) {
    v1::NodeSeries* s = t->add_nodes();
    s->set_node(NodeName(n));
    s->set_ranks(kPerNode);
    for (int c = 0; c < columns; ++c) {
      // The mean of its ranks, as the collector keeps it.
      float sum = 0;
      for (int k = n * kPerNode; k < (n + 1) * kPerNode && k < ranks; ++k) {
        sum += t->ranks(k).busy_seconds(c);
      }
      s->add_busy_seconds(sum / kPerNode);
      s->add_gpu_utilization_ratio(std::min(1.0f, 0.85f * noise(rng)));
      s->add_sm_active_ratio(std::min(1.0f, 0.7f * noise(rng)));
    }
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: report_html_page FILE [RANKS [COLUMNS]]\n";
    return 2;
  }
  const int ranks = argc > 2 ? std::atoi(argv[2]) : 1024;
  const int columns = argc > 3 ? std::atoi(argv[3]) : 100;
  if (ranks < 1 || columns < 1) {
    std::cerr << "report_html_page: RANKS and COLUMNS must be positive\n";
    return 2;
  }
  const std::string page = stepwatch::ctl::RenderReportHtml(SyntheticReport(ranks, columns));
  std::ofstream out(argv[1], std::ios::binary);
  out << page;
  out.close();
  if (!out) {
    std::cerr << "report_html_page: cannot write " << argv[1] << "\n";
    return 1;
  }
  std::cout << page.size() << "\n";
  return 0;
}
