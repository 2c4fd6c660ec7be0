#include "collector/metrics.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "prometheus/metric_type.h"
#include "prometheus/text_serializer.h"
#include "tests/collector/test_util.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::collector {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;

constexpr int64_t kSecond = 1'000'000'000;

const MetricFamily* FindFamily(const std::vector<MetricFamily>& fams, const std::string& name) {
  for (const MetricFamily& f : fams) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string Label(const ClientMetric& m, const std::string& name) {
  for (const auto& l : m.label) {
    if (l.name == name) return l.value;
  }
  return "<absent>";
}

StateSnapshot SampleSnapshot() {
  StateSnapshot s;
  s.now_unix_nanos = 1'700'000'100'000'000'000;
  s.node_down_nanos = 15'000'000'000;
  analysis::JobSnapshot j;
  j.job = "resnet";
  j.split_known = true;
  j.world_size = 16;
  j.ranks_reporting = 16;
  j.last_step = 420;
  j.median_step_seconds = 0.2;
  j.steps_per_second = 5;
  j.efficiency_ratio = 0.8;
  j.breakdown = {0.6, 0.2, 0.1, 0.05, 0.05};
  j.whatif = {1.25, 1.1, 1.05};
  j.scaling_efficiency_ratio = 0.625;
  s.jobs.push_back(j);
  analysis::Finding straggler;
  straggler.kind = analysis::FindingKind::kStraggler;
  straggler.job = "resnet";
  straggler.rank = 13;
  straggler.node = "node-2";
  straggler.gpu = 5;
  straggler.cause = analysis::Cause::kThermalThrottling;
  s.findings.push_back(straggler);
  analysis::Finding underutil;
  underutil.kind = analysis::FindingKind::kUnderutilizedGpu;
  underutil.job = "resnet";
  underutil.node = "node-3";
  underutil.gpu = 1;
  underutil.severity = analysis::Severity::kInfo;
  s.findings.push_back(underutil);
  NodeSnapshot up;
  up.node = "node-2";
  up.agent_id = "a2";
  up.last_seen_unix_nanos = s.now_unix_nanos - 1'000'000'000;
  up.info.set_nvml_available(true);
  v1::GpuSample g;
  g.set_index(5);
  g.set_utilization_gpu_ratio(0.97);
  g.set_sm_clock_mhz(1410);
  g.set_sm_clock_max_mhz(1980);
  g.set_memory_used_bytes(uint64_t{40} << 30);
  g.set_throttle_reasons(0x20);
  g.add_pids(1234);
  up.gpus.push_back(g);
  v1::HostSample h;
  h.set_cpu_count(96);
  h.set_cpu_utilization_ratio(0.3);
  h.set_network_receive_bytes_total(1000);
  up.host = h;
  s.nodes.push_back(up);
  analysis::RankSnapshot slow;
  slow.rank = 13;
  slow.node = "node-2";
  slow.busy_seconds = 0.131;
  slow.busy_vs_median_ratio = 1.31;
  slow.straggler = true;
  s.top_ranks.emplace_back("resnet", slow);
  NodeSnapshot down;
  down.node = "node-3";
  down.last_seen_unix_nanos = s.now_unix_nanos - 60'000'000'000;
  s.nodes.push_back(down);
  s.counters.batches_received = 10;
  s.counters.duplicate_batches = 2;
  s.counters.steps_received = 1000;
  s.counters.steps_rejected["invalid"] = 3;
  s.counters.limit_hits["jobs"] = 4;
  s.agents_connected = 2;
  return s;
}

TEST(MetricsTest, DetectorTimingsAreExportedPerDetector) {
  StateSnapshot s = SampleSnapshot();
  s.detector_timings["straggler"] = {0.25, 40};
  s.detector_timings["stall"] = {0.5, 7};
  // A total series cap does not hide the collector's own health.
  MetricsOptions tight;
  tight.max_series = 1;
  std::vector<MetricFamily> fams = BuildMetricFamilies(s, tight);
  const MetricFamily* seconds = FindFamily(fams, "stepwatch_engine_detector_seconds_total");
  const MetricFamily* runs = FindFamily(fams, "stepwatch_engine_detector_runs_total");
  ASSERT_NE(seconds, nullptr);
  ASSERT_NE(runs, nullptr);
  ASSERT_EQ(seconds->metric.size(), 2u);
  EXPECT_EQ(Label(seconds->metric[0], "detector"), "stall");
  EXPECT_DOUBLE_EQ(seconds->metric[0].counter.value, 0.5);
  EXPECT_EQ(Label(runs->metric[1], "detector"), "straggler");
  EXPECT_DOUBLE_EQ(runs->metric[1].counter.value, 40);
}

TEST(MetricsTest, DesignNamesAndLabels) {
  std::vector<MetricFamily> fams = BuildMetricFamilies(SampleSnapshot(), {});

  const MetricFamily* straggler = FindFamily(fams, "stepwatch_straggler");
  ASSERT_NE(straggler, nullptr);
  ASSERT_EQ(straggler->metric.size(), 1u);
  EXPECT_EQ(Label(straggler->metric[0], "job"), "resnet");
  EXPECT_EQ(Label(straggler->metric[0], "rank"), "13");
  EXPECT_EQ(Label(straggler->metric[0], "node"), "node-2");
  EXPECT_EQ(straggler->metric[0].gauge.value, 1);

  const MetricFamily* under = FindFamily(fams, "stepwatch_gpu_underutilized");
  ASSERT_NE(under, nullptr);
  ASSERT_EQ(under->metric.size(), 1u);
  EXPECT_EQ(Label(under->metric[0], "node"), "node-3");
  EXPECT_EQ(Label(under->metric[0], "gpu"), "1");

  const MetricFamily* time_ratio = FindFamily(fams, "stepwatch_job_time_ratio");
  ASSERT_NE(time_ratio, nullptr);
  ASSERT_EQ(time_ratio->metric.size(), 5u);
  for (const ClientMetric& m : time_ratio->metric) {
    if (Label(m, "component") == "imbalance") {
      EXPECT_DOUBLE_EQ(m.gauge.value, 0.2);
    }
  }
  const MetricFamily* whatif = FindFamily(fams, "stepwatch_job_whatif_speedup_ratio");
  ASSERT_NE(whatif, nullptr);
  std::vector<std::string> fixes;
  for (const ClientMetric& m : whatif->metric) fixes.push_back(Label(m, "fix"));
  EXPECT_EQ(fixes, (std::vector<std::string>{"stragglers", "overlap", "data"}));

  const MetricFamily* scaling = FindFamily(fams, "stepwatch_job_scaling_efficiency_ratio");
  ASSERT_NE(scaling, nullptr);
  EXPECT_DOUBLE_EQ(scaling->metric[0].gauge.value, 0.625);
  for (const char* name : {"stepwatch_job_step_seconds", "stepwatch_job_efficiency_ratio",
                           "stepwatch_job_steps_per_second", "stepwatch_job_world_size",
                           "stepwatch_job_last_step", "stepwatch_job_ranks_reporting"}) {
    const MetricFamily* f = FindFamily(fams, name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_EQ(Label(f->metric[0], "job"), "resnet") << name;
  }

  const MetricFamily* top = FindFamily(fams, "stepwatch_rank_busy_vs_median_ratio");
  ASSERT_NE(top, nullptr);
  ASSERT_EQ(top->metric.size(), 1u);
  EXPECT_EQ(Label(top->metric[0], "rank"), "13");
  EXPECT_DOUBLE_EQ(top->metric[0].gauge.value, 1.31);

  const MetricFamily* counts = FindFamily(fams, "stepwatch_findings");
  ASSERT_NE(counts, nullptr);
  EXPECT_EQ(counts->metric.size(), 2u);
  const MetricFamily* each = FindFamily(fams, "stepwatch_finding");
  ASSERT_NE(each, nullptr);
  EXPECT_EQ(each->metric.size(), 2u);
  EXPECT_EQ(Label(each->metric[0], "cause"), "thermal_throttling");
  EXPECT_EQ(Label(each->metric[0], "stage"), "");
  EXPECT_EQ(Label(each->metric[1], "cause"), "unknown");
}

// Each finding with a size carries it beside its stepwatch_finding series, with the same labels,
// so that an alert can say "+16%" or "1.40x"; kinds without a size (a stall) have none.
TEST(MetricsTest, FindingSizesCarryTheFindingsLabels) {
  StateSnapshot s = SampleSnapshot();
  s.findings.clear();
  analysis::Finding regression;
  regression.kind = analysis::FindingKind::kRegression;
  regression.job = "llm";
  regression.cause = analysis::Cause::kImbalance;
  regression.evidence.step_vs_baseline_ratio = 1.16;
  analysis::Finding stage;
  stage.kind = analysis::FindingKind::kPipelineImbalance;
  stage.job = "llm";
  stage.stage = 2;
  stage.evidence.stage_vs_median_ratio = 1.4;
  analysis::Finding stall;
  stall.kind = analysis::FindingKind::kStall;
  stall.job = "llm";
  s.findings = {regression, stage, stall};
  std::vector<MetricFamily> fams = BuildMetricFamilies(s, MetricsOptions());
  const MetricFamily* sizes = FindFamily(fams, "stepwatch_finding_size_ratio");
  ASSERT_NE(sizes, nullptr);
  ASSERT_EQ(sizes->metric.size(), 2u);
  EXPECT_EQ(Label(sizes->metric[0], "kind"), "regression");
  EXPECT_EQ(Label(sizes->metric[0], "cause"), "imbalance");
  EXPECT_DOUBLE_EQ(sizes->metric[0].gauge.value, 1.16);
  EXPECT_EQ(Label(sizes->metric[1], "kind"), "pipeline_imbalance");
  EXPECT_EQ(Label(sizes->metric[1], "stage"), "2");
  EXPECT_DOUBLE_EQ(sizes->metric[1].gauge.value, 1.4);
  const MetricFamily* each = FindFamily(fams, "stepwatch_finding");
  ASSERT_NE(each, nullptr);
  ASSERT_EQ(each->metric.size(), 3u);
  EXPECT_EQ(each->metric[0].label.size(), sizes->metric[0].label.size());
}

// A slow node's ranks and a slow pipeline stage's ranks carry no straggler finding of their own:
// stepwatch_straggler comes from the ranks' flags, and the findings say where and why.
TEST(MetricsTest, EveryFlaggedRankIsAStraggler) {
  StateSnapshot s = SampleSnapshot();
  for (int rank = 16; rank < 24; ++rank) {
    analysis::RankSnapshot r;
    r.rank = rank;
    r.node = "node-4";
    r.busy_vs_median_ratio = 1.2;
    r.straggler = true;
    s.top_ranks.emplace_back("resnet", r);
  }
  analysis::RankSnapshot unflagged;  // one of the top ranks, not flagged
  unflagged.rank = 3;
  unflagged.node = "node-0";
  unflagged.busy_vs_median_ratio = 1.01;
  s.top_ranks.emplace_back("resnet", unflagged);
  analysis::Finding node;
  node.kind = analysis::FindingKind::kSlowNode;
  node.job = "resnet";
  node.node = "node-4";
  node.cause = analysis::Cause::kPowerThrottling;
  s.findings.push_back(node);
  analysis::Finding stage;
  stage.kind = analysis::FindingKind::kPipelineImbalance;
  stage.job = "resnet";
  stage.stage = 2;
  stage.cause = analysis::Cause::kMoreWork;
  s.findings.push_back(stage);

  std::vector<MetricFamily> fams = BuildMetricFamilies(s, {});
  const MetricFamily* straggler = FindFamily(fams, "stepwatch_straggler");
  ASSERT_NE(straggler, nullptr);
  std::vector<std::string> ranks;
  for (const ClientMetric& m : straggler->metric) ranks.push_back(Label(m, "rank"));
  EXPECT_EQ(ranks,
            (std::vector<std::string>{"13", "16", "17", "18", "19", "20", "21", "22", "23"}));
  EXPECT_EQ(FindFamily(fams, "stepwatch_rank_busy_seconds")->metric.size(), 10u);

  const MetricFamily* each = FindFamily(fams, "stepwatch_finding");
  ASSERT_NE(each, nullptr);
  std::map<std::string, std::pair<std::string, std::string>> where;  // kind -> (node|stage, cause)
  for (const ClientMetric& m : each->metric) {
    const std::string kind = Label(m, "kind");
    where[kind] = {kind == "pipeline_imbalance" ? Label(m, "stage") : Label(m, "node"),
                   Label(m, "cause")};
  }
  EXPECT_EQ(where["slow_node"],
            std::make_pair(std::string("node-4"), std::string("power_throttling")));
  EXPECT_EQ(where["pipeline_imbalance"],
            std::make_pair(std::string("2"), std::string("more_work")));
}

// Without the split of the step, efficiency, time shares and what-ifs are unknown: no series,
// rather than a made-up 100% compute.
TEST(MetricsTest, UnknownSplitLeavesOutEfficiencyBreakdownAndWhatIfs) {
  StateSnapshot s = SampleSnapshot();
  s.jobs[0].split_known = false;
  std::vector<MetricFamily> fams = BuildMetricFamilies(s, {});
  for (const char* name : {"stepwatch_job_efficiency_ratio", "stepwatch_job_time_ratio",
                           "stepwatch_job_whatif_speedup_ratio"}) {
    EXPECT_EQ(FindFamily(fams, name), nullptr) << name;
  }
  const MetricFamily* known = FindFamily(fams, "stepwatch_job_split_known");
  ASSERT_NE(known, nullptr);
  EXPECT_EQ(known->metric[0].gauge.value, 0);
  // What does not depend on the split stays.
  EXPECT_NE(FindFamily(fams, "stepwatch_job_step_seconds"), nullptr);
  EXPECT_NE(FindFamily(fams, "stepwatch_job_scaling_efficiency_ratio"), nullptr);
}

// Steps analysed without all their ranks, and samples that came too late for theirs, are counters
// an operator can alert on (one agent far behind the others).
TEST(MetricsTest, IncompleteStepsAndLateSamplesAreCounters) {
  StateSnapshot s = SampleSnapshot();
  s.jobs[0].incomplete_steps = 12;
  s.jobs[0].late_samples = 30;
  std::vector<MetricFamily> fams = BuildMetricFamilies(s, {});
  const MetricFamily* incomplete = FindFamily(fams, "stepwatch_job_steps_incomplete_total");
  ASSERT_NE(incomplete, nullptr);
  EXPECT_EQ(incomplete->type, prometheus::MetricType::Counter);
  EXPECT_EQ(incomplete->metric[0].counter.value, 12);
  const MetricFamily* late = FindFamily(fams, "stepwatch_job_step_samples_late_total");
  ASSERT_NE(late, nullptr);
  EXPECT_EQ(late->metric[0].counter.value, 30);
}

// Through the real state: flagged ranks of every job come before any job's merely slow ranks, the
// cap holds, and what it leaves out is counted at each scrape.
TEST(MetricsTest, RankSeriesCapKeepsFlaggedRanksFirst) {
  SimulatedClock clock;
  CollectorStateOptions options;
  options.top_ranks_per_job = 2;
  options.max_rank_series = 3;
  CollectorState state(options, &clock);
  // Jobs a and b, 8 ranks each; rank 5 of each computes 60% longer than its peers.
  for (int step = 0; step < 60; ++step) {
    ASSERT_OK(state.Apply(testing::StepBatch("n0", step + 1, "a", 8, step, 0.1, 5, 0.16)));
    ASSERT_OK(state.Apply(testing::StepBatch("n1", step + 1, "b", 8, step, 0.1, 5, 0.16)));
    clock.AdvanceTime(absl::Milliseconds(200));
    state.Tick();
  }
  StateSnapshot snap = state.Snapshot();
  std::vector<std::string> kept;
  for (const auto& [job, r] : snap.top_ranks) kept.push_back(absl::StrCat(job, "/", r.rank));
  // Flagged a/5 and b/5 first, then a's slowest unflagged rank; b's is left out by the cap.
  EXPECT_EQ(kept, (std::vector<std::string>{"a/5", "b/5", "a/0"}));
  EXPECT_EQ(snap.counters.rank_series_dropped, 1u);

  std::vector<MetricFamily> fams = BuildMetricFamilies(state.Snapshot(), {});
  const MetricFamily* straggler = FindFamily(fams, "stepwatch_straggler");
  ASSERT_NE(straggler, nullptr);
  ASSERT_EQ(straggler->metric.size(), 2u);
  EXPECT_EQ(FindFamily(fams, "stepwatch_rank_busy_seconds")->metric.size(), 3u);
  EXPECT_EQ(FindFamily(fams, "stepwatch_collector_series_dropped_total")->metric[0].counter.value,
            2);  // one per scrape
}

TEST(MetricsTest, CollectableCountsFindingSeriesLeftOut) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  for (int step = 0; step < 60; ++step) {
    ASSERT_OK(state.Apply(testing::StepBatch("n0", step + 1, "a", 8, step, 0.1, 5, 0.16)));
    clock.AdvanceTime(absl::Milliseconds(200));
    state.Tick();
  }
  const size_t findings = state.Snapshot().findings.size();
  ASSERT_GE(findings, 1u);
  MetricsOptions o;
  o.max_finding_series = 0;
  StateCollectable collectable(&state, o);
  collectable.Collect();
  std::vector<MetricFamily> fams = collectable.Collect();
  EXPECT_EQ(FindFamily(fams, "stepwatch_finding"), nullptr);
  const MetricFamily* dropped = FindFamily(fams, "stepwatch_collector_series_dropped_total");
  ASSERT_NE(dropped, nullptr);
  EXPECT_EQ(Label(dropped->metric[1], "family"), "finding");
  EXPECT_EQ(dropped->metric[1].counter.value, 2.0 * findings);  // two scrapes
}

TEST(MetricsTest, DroppedRankSeriesAreCounted) {
  StateSnapshot s = SampleSnapshot();
  s.counters.rank_series_dropped = 7;
  s.counters.finding_series_dropped = 3;
  std::vector<MetricFamily> fams = BuildMetricFamilies(s, {});
  const MetricFamily* dropped = FindFamily(fams, "stepwatch_collector_series_dropped_total");
  ASSERT_NE(dropped, nullptr);
  EXPECT_EQ(dropped->type, prometheus::MetricType::Counter);
  ASSERT_EQ(dropped->metric.size(), 6u);  // rank, finding, job, node, gpu, host
  EXPECT_EQ(Label(dropped->metric[0], "family"), "rank");
  EXPECT_EQ(dropped->metric[0].counter.value, 7);
  EXPECT_EQ(Label(dropped->metric[1], "family"), "finding");
  EXPECT_EQ(dropped->metric[1].counter.value, 3);
}

// Counts the series of the snapshot's families other than the collector's own.
size_t CappedSeries(const std::vector<MetricFamily>& fams) {
  size_t n = 0;
  for (const MetricFamily& f : fams) {
    if (f.name.rfind("stepwatch_collector_", 0) != 0) n += f.metric.size();
  }
  return n;
}

double Dropped(const std::vector<MetricFamily>& fams, const std::string& family) {
  const MetricFamily* dropped = FindFamily(fams, "stepwatch_collector_series_dropped_total");
  if (dropped == nullptr) return -1;
  for (const ClientMetric& m : dropped->metric) {
    if (Label(m, "family") == family) return m.counter.value;
  }
  return -1;
}

TEST(MetricsTest, TotalSeriesCapKeepsTheMostImportantFirst) {
  StateSnapshot s = SampleSnapshot();
  // Many nodes of many GPUs: the cap must keep findings, stragglers and the job's series, and
  // every node's up series before any GPU series.
  for (int n = 0; n < 50; ++n) {
    NodeSnapshot v;
    v.node = absl::StrCat("big-", n);
    v.last_seen_unix_nanos = s.now_unix_nanos;
    for (int g = 0; g < 8; ++g) {
      v1::GpuSample gpu;
      gpu.set_index(g);
      gpu.set_utilization_gpu_ratio(0.5);
      gpu.set_sm_activity_ratio(0.4);
      gpu.set_power_watts(300);
      v.gpus.push_back(gpu);
    }
    s.nodes.push_back(v);
  }
  // Every node's readings, as --export-node-metrics=all: the cap alone bounds them.
  MetricsOptions all;
  all.export_node_metrics = NodeMetricsExport::kAll;
  const size_t uncapped = CappedSeries(BuildMetricFamilies(s, all));
  MetricsOptions o = all;
  o.max_series = 200;
  ASSERT_GT(uncapped, 400u);
  SeriesDrops drops;
  std::vector<MetricFamily> fams = BuildMetricFamilies(s, o, &drops);
  EXPECT_EQ(CappedSeries(fams), 200u);
  for (const char* kept : {"stepwatch_finding", "stepwatch_findings", "stepwatch_straggler",
                           "stepwatch_job_step_seconds", "stepwatch_job_efficiency_ratio",
                           "stepwatch_gpu_underutilized"}) {
    EXPECT_NE(FindFamily(fams, kept), nullptr) << kept;
  }
  const MetricFamily* up = FindFamily(fams, "stepwatch_node_up");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->metric.size(), s.nodes.size());
  // Every GPU's utilization before any GPU's power.
  EXPECT_EQ(FindFamily(fams, "stepwatch_gpu_power_watts"), nullptr);
  EXPECT_EQ(FindFamily(fams, "stepwatch_host_cpus"), nullptr);
  // What was left out is counted by family, and adds up.
  uint64_t total = 0;
  for (const auto& [family, n] : drops) total += n;
  EXPECT_EQ(total, uncapped - 200);
  EXPECT_GT(Dropped(fams, "gpu"), 0);
  EXPECT_EQ(Dropped(fams, "gpu"), static_cast<double>(drops["gpu"]));
  EXPECT_EQ(Dropped(fams, "job"), 0);
  // The collector's own series are never cut.
  EXPECT_NE(FindFamily(fams, "stepwatch_collector_memory_budget_bytes"), nullptr);
}

TEST(MetricsTest, CollectableSumsTotalCapDropsOverScrapes) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  ASSERT_OK(state.Apply(testing::StepBatch("n0", 1, "a", 8, 0, 0.1)));
  state.Tick();  // scrapes read what the last Tick published
  MetricsOptions o;
  o.max_series = 3;
  StateCollectable collectable(&state, o);
  const double first = Dropped(collectable.Collect(), "job");
  ASSERT_GT(first, 0);
  EXPECT_EQ(Dropped(collectable.Collect(), "job"), 2 * first);
}

TEST(MetricsTest, NodeGpuAndHostSeriesInBaseUnits) {
  std::vector<MetricFamily> fams = BuildMetricFamilies(SampleSnapshot(), {});
  const MetricFamily* clock = FindFamily(fams, "stepwatch_gpu_sm_clock_hertz");
  ASSERT_NE(clock, nullptr);
  EXPECT_DOUBLE_EQ(clock->metric[0].gauge.value, 1410e6);
  EXPECT_EQ(Label(clock->metric[0], "gpu"), "5");
  EXPECT_EQ(Label(clock->metric[0], "node"), "node-2");
  ASSERT_NE(FindFamily(fams, "stepwatch_gpu_memory_used_bytes"), nullptr);
  ASSERT_NE(FindFamily(fams, "stepwatch_gpu_throttle_reasons"), nullptr);
  // Not reported by the agent: no series rather than a made-up zero.
  EXPECT_EQ(FindFamily(fams, "stepwatch_gpu_power_watts"), nullptr);
  EXPECT_EQ(FindFamily(fams, "stepwatch_gpu_sm_activity_ratio"), nullptr);

  const MetricFamily* net = FindFamily(fams, "stepwatch_host_network_receive_bytes_total");
  ASSERT_NE(net, nullptr);
  EXPECT_EQ(net->type, prometheus::MetricType::Counter);

  const MetricFamily* up = FindFamily(fams, "stepwatch_node_up");
  ASSERT_NE(up, nullptr);
  ASSERT_EQ(up->metric.size(), 2u);
  EXPECT_EQ(Label(up->metric[0], "node"), "node-2");
  EXPECT_EQ(up->metric[0].gauge.value, 1);
  EXPECT_EQ(up->metric[1].gauge.value, 0);  // silent for 60 s > 15 s
  const MetricFamily* seen = FindFamily(fams, "stepwatch_node_last_seen_timestamp_seconds");
  ASSERT_NE(seen, nullptr);
  EXPECT_DOUBLE_EQ(seen->metric[0].gauge.value, 1'700'000'099.0);
}

TEST(MetricsTest, CollectorHealth) {
  std::vector<MetricFamily> fams = BuildMetricFamilies(SampleSnapshot(), {});
  const MetricFamily* dup = FindFamily(fams, "stepwatch_collector_duplicate_batches_total");
  ASSERT_NE(dup, nullptr);
  EXPECT_EQ(dup->type, prometheus::MetricType::Counter);
  EXPECT_EQ(dup->metric[0].counter.value, 2);
  const MetricFamily* rejected = FindFamily(fams, "stepwatch_collector_steps_rejected_total");
  ASSERT_NE(rejected, nullptr);
  EXPECT_EQ(Label(rejected->metric[0], "reason"), "invalid");
  EXPECT_EQ(rejected->metric[0].counter.value, 3);
  const MetricFamily* limits = FindFamily(fams, "stepwatch_collector_limit_hits_total");
  ASSERT_NE(limits, nullptr);
  EXPECT_EQ(Label(limits->metric[0], "limit"), "jobs");
  EXPECT_EQ(limits->metric[0].counter.value, 4);
  const MetricFamily* agents = FindFamily(fams, "stepwatch_collector_agents_connected");
  ASSERT_NE(agents, nullptr);
  EXPECT_EQ(agents->metric[0].gauge.value, 2);
}

TEST(MetricsTest, FindingSeriesAreBounded) {
  StateSnapshot s = SampleSnapshot();
  for (int rank = 0; rank < 50; ++rank) {
    analysis::Finding f;
    f.kind = analysis::FindingKind::kStraggler;
    f.job = "big";
    f.rank = rank;
    s.findings.push_back(f);
  }
  MetricsOptions o;
  o.max_finding_series = 10;
  std::vector<MetricFamily> fams = BuildMetricFamilies(s, o);
  EXPECT_EQ(FindFamily(fams, "stepwatch_finding")->metric.size(), 10u);
  // The counts stay complete.
  double total = 0;
  for (const ClientMetric& m : FindFamily(fams, "stepwatch_findings")->metric) {
    total += m.gauge.value;
  }
  EXPECT_EQ(total, 52);
}

TEST(MetricsTest, EmptyStateHasNoJobSeries) {
  std::vector<MetricFamily> fams = BuildMetricFamilies(StateSnapshot{}, {});
  EXPECT_EQ(FindFamily(fams, "stepwatch_job_step_seconds"), nullptr);
  EXPECT_EQ(FindFamily(fams, "stepwatch_straggler"), nullptr);
  EXPECT_NE(FindFamily(fams, "stepwatch_collector_batches_received_total"), nullptr);
}

TEST(MetricsTest, ExpositionIsCleanUnderPromtool) {
  const std::string text =
      prometheus::TextSerializer().Serialize(BuildMetricFamilies(SampleSnapshot(), {}));
  absl::StatusOr<std::string> lint = testing::PromtoolCheck(text);
  if (absl::IsUnavailable(lint.status())) GTEST_SKIP() << lint.status();
  ASSERT_OK(lint);
  EXPECT_EQ(*lint, "") << text;
  // Every family carries HELP and TYPE.
  for (const MetricFamily& f : BuildMetricFamilies(SampleSnapshot(), {})) {
    EXPECT_NE(text.find("# HELP " + f.name + " "), std::string::npos) << f.name;
    EXPECT_NE(text.find("# TYPE " + f.name + " "), std::string::npos) << f.name;
  }
}

// --export-node-metrics: which nodes' and GPUs' readings the collector re-exports.

// A node seen at `last_seen` with GPUs 0..gpus-1 (utilization and power) and a host sample.
NodeSnapshot NodeWithReadings(const std::string& name, int64_t last_seen, int gpus) {
  NodeSnapshot v;
  v.node = name;
  v.last_seen_unix_nanos = last_seen;
  for (int g = 0; g < gpus; ++g) {
    v1::GpuSample gpu;
    gpu.set_index(g);
    gpu.set_utilization_gpu_ratio(0.5);
    gpu.set_power_watts(300);
    v.gpus.push_back(gpu);
  }
  v1::HostSample h;
  h.set_cpu_count(64);
  v.host = h;
  return v;
}

bool IsReading(const std::string& family) {
  return (family.rfind("stepwatch_gpu_", 0) == 0 && family != "stepwatch_gpu_underutilized") ||
         family.rfind("stepwatch_host_", 0) == 0;
}

// "node/gpu" of every GPU reading series, "node" of every host reading series.
std::set<std::string> GpusWithReadings(const std::vector<MetricFamily>& fams) {
  std::set<std::string> out;
  for (const MetricFamily& f : fams) {
    if (!IsReading(f.name) || f.name.rfind("stepwatch_gpu_", 0) != 0) continue;
    for (const ClientMetric& m : f.metric) out.insert(Label(m, "node") + "/" + Label(m, "gpu"));
  }
  return out;
}

std::set<std::string> NodesOf(const std::vector<MetricFamily>& fams, const std::string& prefix) {
  std::set<std::string> out;
  for (const MetricFamily& f : fams) {
    if (f.name.rfind(prefix, 0) != 0 || (prefix == "stepwatch_gpu_" && !IsReading(f.name))) {
      continue;
    }
    for (const ClientMetric& m : f.metric) out.insert(Label(m, "node"));
  }
  return out;
}

std::set<std::string> EveryGpuOf(const std::string& node, int gpus) {
  std::set<std::string> out;
  for (int g = 0; g < gpus; ++g) out.insert(absl::StrCat(node, "/", g));
  return out;
}

TEST(MetricsTest, DefaultExportsOnlyReadingsOfTheGpusInFindings) {
  StateSnapshot s = SampleSnapshot();
  // node-2 (a straggler on its GPU 5) gets seven more GPUs; node-9 is healthy and in no finding.
  for (int g : {0, 1, 2, 3, 4, 6, 7}) {
    v1::GpuSample gpu;
    gpu.set_index(g);
    gpu.set_utilization_gpu_ratio(0.9);
    s.nodes[0].gpus.push_back(gpu);
  }
  s.nodes.push_back(NodeWithReadings("node-9", s.now_unix_nanos, 8));

  ASSERT_EQ(MetricsOptions{}.export_node_metrics, NodeMetricsExport::kFindings);
  const std::vector<MetricFamily> fams = BuildMetricFamilies(s, {});
  EXPECT_EQ(GpusWithReadings(fams), (std::set<std::string>{"node-2/5"}));
  EXPECT_EQ(NodesOf(fams, "stepwatch_host_"), (std::set<std::string>{"node-2"}));
  // node-3 is in a finding (and quiet); node-9 in neither.
  EXPECT_EQ(NodesOf(fams, "stepwatch_node_"), (std::set<std::string>{"node-2", "node-3"}));
  for (const MetricFamily& f : fams) {
    for (const ClientMetric& m : f.metric) EXPECT_NE(Label(m, "node"), "node-9") << f.name;
  }
  EXPECT_EQ(FindFamily(fams, "stepwatch_collector_nodes")->metric[0].gauge.value, 3);

  // `all` restores every node's and GPU's readings.
  MetricsOptions all;
  all.export_node_metrics = NodeMetricsExport::kAll;
  const std::vector<MetricFamily> every = BuildMetricFamilies(s, all);
  std::set<std::string> expected = EveryGpuOf("node-2", 8);
  expected.merge(EveryGpuOf("node-9", 8));
  EXPECT_EQ(GpusWithReadings(every), expected);
  EXPECT_EQ(NodesOf(every, "stepwatch_host_"), (std::set<std::string>{"node-2", "node-9"}));
  EXPECT_EQ(NodesOf(every, "stepwatch_node_"),
            (std::set<std::string>{"node-2", "node-3", "node-9"}));
}

// A finding about a node but no one GPU (a slow node) brings every GPU of that node; the devices
// of a finding's evidence bring theirs.
TEST(MetricsTest, NodeFindingWithoutGpuExportsEveryGpuOfTheNode) {
  StateSnapshot s;
  s.now_unix_nanos = 1'700'000'100'000'000'000;
  s.node_down_nanos = 15 * kSecond;
  for (const char* node : {"node-4", "node-5", "node-6", "node-7"}) {
    s.nodes.push_back(NodeWithReadings(node, s.now_unix_nanos, 8));
  }
  analysis::Finding slow;
  slow.kind = analysis::FindingKind::kSlowNode;
  slow.job = "llm";
  slow.node = "node-4";
  s.findings.push_back(slow);
  analysis::Finding straggler;
  straggler.kind = analysis::FindingKind::kStraggler;
  straggler.job = "llm";
  straggler.rank = 50;
  straggler.node = "node-6";
  straggler.gpu = 3;
  analysis::DeviceEvidence peer;
  peer.node = "node-7";
  peer.gpu = 2;
  straggler.evidence.devices.push_back(peer);
  s.findings.push_back(straggler);
  const std::vector<MetricFamily> fams = BuildMetricFamilies(s, {});
  std::set<std::string> expected = EveryGpuOf("node-4", 8);
  expected.insert({"node-6/3", "node-7/2"});
  EXPECT_EQ(GpusWithReadings(fams), expected);
  EXPECT_EQ(NodesOf(fams, "stepwatch_host_"),
            (std::set<std::string>{"node-4", "node-6", "node-7"}));
}

// A quiet node in no finding still reads down (the collector alone knows its agent stopped
// reaching it), without its readings.
TEST(MetricsTest, QuietNodeReadsDownWithoutItsReadings) {
  StateSnapshot s;
  s.now_unix_nanos = 1'700'000'100'000'000'000;
  s.node_down_nanos = 15 * kSecond;
  s.nodes.push_back(NodeWithReadings("node-1", s.now_unix_nanos - kSecond, 8));
  s.nodes.push_back(NodeWithReadings("node-8", s.now_unix_nanos - 60 * kSecond, 8));
  const std::vector<MetricFamily> fams = BuildMetricFamilies(s, {});
  const MetricFamily* up = FindFamily(fams, "stepwatch_node_up");
  ASSERT_NE(up, nullptr);
  ASSERT_EQ(up->metric.size(), 1u);
  EXPECT_EQ(Label(up->metric[0], "node"), "node-8");
  EXPECT_EQ(up->metric[0].gauge.value, 0);
  EXPECT_TRUE(GpusWithReadings(fams).empty());
  EXPECT_TRUE(NodesOf(fams, "stepwatch_host_").empty());
}

// `nodes` nodes of 8 GPUs with host samples and no steps (so no findings), scraped through the
// collectable as /metrics does.
struct Fleet {
  SimulatedClock clock;
  CollectorState state{{}, &clock};
  explicit Fleet(int nodes) {
    for (int n = 0; n < nodes; ++n) {
      v1::ReportBatch b = testing::EmptyBatch(absl::StrCat("node-", n), 1);
      for (int g = 0; g < 8; ++g) {
        v1::GpuSample* gpu = b.add_gpus();
        gpu->set_index(g);
        gpu->set_utilization_gpu_ratio(0.9);
        gpu->set_power_watts(400);
      }
      b.mutable_host()->set_cpu_count(64);
      EXPECT_OK(state.Apply(b));
    }
    state.Tick();
  }
};

size_t SeriesCount(const std::vector<MetricFamily>& fams) {
  size_t n = 0;
  for (const MetricFamily& f : fams) n += f.metric.size();
  return n;
}

TEST(MetricsTest, ScrapeDoesNotGrowWithTheFleetWithoutFindings) {
  Fleet small(1000);
  Fleet large(5000);
  ASSERT_TRUE(large.state.Snapshot().findings.empty());
  StateCollectable small_scrape(&small.state, {});
  StateCollectable large_scrape(&large.state, {});
  const std::vector<MetricFamily> s = small_scrape.Collect();
  const std::vector<MetricFamily> l = large_scrape.Collect();
  EXPECT_TRUE(GpusWithReadings(l).empty());
  EXPECT_TRUE(NodesOf(l, "stepwatch_host_").empty());
  EXPECT_EQ(FindFamily(l, "stepwatch_node_up"), nullptr);
  EXPECT_EQ(SeriesCount(s), SeriesCount(l));
  // Only the digits of the collector's own counts differ.
  const size_t small_bytes = prometheus::TextSerializer().Serialize(s).size();
  const size_t large_bytes = prometheus::TextSerializer().Serialize(l).size();
  EXPECT_LT(large_bytes, small_bytes + 64);
  EXPECT_EQ(FindFamily(l, "stepwatch_collector_nodes")->metric[0].gauge.value, 5000);
  // The scrape copies none of the nodes (its work follows what it exports).
  EXPECT_TRUE(large.state.Snapshot(NodeScope::kInvolved).nodes.empty());
  EXPECT_EQ(large.state.Snapshot(NodeScope::kInvolved).nodes_tracked, 5000u);

  // The readings are there: `all` exports them, so they grow with the fleet.
  MetricsOptions all;
  all.export_node_metrics = NodeMetricsExport::kAll;
  all.max_series = 0;
  const std::vector<MetricFamily> every = StateCollectable(&large.state, all).Collect();
  EXPECT_EQ(GpusWithReadings(every).size(), 5000u * 8);
  EXPECT_EQ(NodesOf(every, "stepwatch_host_").size(), 5000u);
}

// The scoped snapshot holds the nodes named by findings and the quiet ones, nothing else.
TEST(MetricsTest, InvolvedSnapshotHoldsNodesInFindingsAndQuietNodes) {
  Fleet fleet(100);
  fleet.clock.AdvanceTime(absl::Seconds(20));  // beyond the 15 s after which a node reads down
  for (int n = 1; n < 100; ++n) {
    ASSERT_OK(fleet.state.Apply(testing::EmptyBatch(absl::StrCat("node-", n), 2)));
  }
  fleet.state.Tick();
  const StateSnapshot s = fleet.state.Snapshot(NodeScope::kInvolved);
  ASSERT_EQ(s.nodes.size(), 1u);
  EXPECT_EQ(s.nodes[0].node, "node-0");
  EXPECT_EQ(s.nodes_tracked, 100u);
  EXPECT_EQ(fleet.state.Snapshot().nodes.size(), 100u);
  const std::vector<MetricFamily> fams = StateCollectable(&fleet.state, {}).Collect();
  ASSERT_NE(FindFamily(fams, "stepwatch_node_up"), nullptr);
  EXPECT_EQ(FindFamily(fams, "stepwatch_node_up")->metric.size(), 1u);
  EXPECT_EQ(FindFamily(fams, "stepwatch_node_up")->metric[0].gauge.value, 0);
}

// Under the default, a node's GPU reaches /metrics once a finding names it: an underutilized GPU
// found by the engine from real batches.
TEST(MetricsTest, UnderutilizedGpuFoundFromBatchesIsExported) {
  SimulatedClock clock;
  CollectorStateOptions options;
  CollectorState state(options, &clock);
  const int64_t window_steps =
      absl::ToInt64Nanoseconds(options.engine.underutil_window) / (kSecond / 2) + 10;
  for (int64_t step = 0; step < window_steps; ++step) {
    for (int n = 0; n < 2; ++n) {
      v1::ReportBatch b =
          testing::StepBatch(absl::StrCat("node-", n), step + 1, "job", 1, step, 0.1);
      b.mutable_steps(0)->set_world_size(2);
      b.mutable_steps(0)->set_rank(n);  // rank n on node-n, on its GPU n (StepBatch: rank % 8)
      b.mutable_steps(0)->set_gpu(n);
      for (int g = 0; g < 2; ++g) {
        v1::GpuSample* gpu = b.add_gpus();
        gpu->set_index(g);
        // GPU 1 of node-1 idles at 10% while its rank runs; the others are busy.
        gpu->set_utilization_gpu_ratio(n == 1 && g == 1 ? 0.1 : 0.95);
      }
      ASSERT_OK(state.Apply(b));
    }
    clock.AdvanceTime(absl::Milliseconds(500));
    state.Tick();
  }
  const std::vector<MetricFamily> fams = StateCollectable(&state, {}).Collect();
  ASSERT_NE(FindFamily(fams, "stepwatch_gpu_underutilized"), nullptr) << "no finding";
  const std::set<std::string> gpus = GpusWithReadings(fams);
  EXPECT_EQ(gpus.count("node-1/1"), 1u);
  EXPECT_EQ(gpus.count("node-0/0"), 0u);
  EXPECT_EQ(gpus.count("node-0/1"), 0u);
}

}  // namespace
}  // namespace stepwatch::collector
