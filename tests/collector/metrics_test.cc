#include "collector/metrics.h"

#include <algorithm>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/collector/test_util.h"

namespace stepwatch::collector {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;

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
  j.world_size = 16;
  j.ranks_reporting = 16;
  j.last_step = 420;
  j.median_step_s = 0.2;
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
  s.findings.push_back(straggler);
  analysis::Finding underutil;
  underutil.kind = analysis::FindingKind::kUnderutilizedGpu;
  underutil.job = "resnet";
  underutil.node = "node-3";
  underutil.gpu = 1;
  underutil.severity = analysis::Severity::kInfo;
  s.findings.push_back(underutil);
  NodeView up;
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
  slow.busy_s = 0.131;
  slow.busy_vs_median_ratio = 1.31;
  s.top_ranks.emplace_back("resnet", slow);
  NodeView down;
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
  ASSERT_TRUE(lint.ok()) << lint.status();
  EXPECT_EQ(*lint, "") << text;
  // Every family carries HELP and TYPE.
  for (const MetricFamily& f : BuildMetricFamilies(SampleSnapshot(), {})) {
    EXPECT_NE(text.find("# HELP " + f.name + " "), std::string::npos) << f.name;
    EXPECT_NE(text.find("# TYPE " + f.name + " "), std::string::npos) << f.name;
  }
}

}  // namespace
}  // namespace stepwatch::collector
