// Kubernetes attribution in the collector: names bounded, ranks' pods, what a finding is labelled
// with, and those labels on /metrics.
#include "collector/pod_index.h"

#include <memory>
#include <string>
#include <vector>

#include "collector/metrics.h"
#include "gtest/gtest.h"

namespace stepwatch::collector {
namespace {

PodNames Pod(const std::string& ns, const std::string& pod, const std::string& container) {
  return PodNames{ns, pod, container};
}

// Job "llm": ranks 0-3 in pod worker-0, ranks 4-7 in pod worker-1, both of namespace team-a.
PodIndex TwoPods() {
  PodIndex index;
  for (int rank = 0; rank < 8; ++rank) {
    index.SetRank("llm", rank, Pod("team-a", rank < 4 ? "worker-0" : "worker-1", "trainer"));
  }
  return index;
}

TEST(PodIndexTest, NamesOutOfBoundsOrWithControlCharactersAreRefused) {
  v1::KubernetesPod pod;
  pod.set_namespace_("team-a");
  pod.set_pod(std::string(kMaxKubernetesNameBytes, 'p'));
  EXPECT_FALSE(CheckKubernetesPod(pod, "step_kubernetes_pod").has_value());
  pod.set_pod(std::string(kMaxKubernetesNameBytes + 1, 'p'));
  ASSERT_TRUE(CheckKubernetesPod(pod, "step_kubernetes_pod").has_value());
  EXPECT_STREQ(CheckKubernetesPod(pod, "step_kubernetes_pod")->reason, "too_long");
  pod.set_pod("ok");
  pod.set_container("a\nb");
  ASSERT_TRUE(CheckKubernetesPod(pod, "gpu_kubernetes_pod").has_value());
  EXPECT_STREQ(CheckKubernetesPod(pod, "gpu_kubernetes_pod")->reason, "control_character");
}

TEST(PodIndexTest, SetChargesAndForgets) {
  PodIndex index;
  const PodNames long_pod = Pod("team-a", std::string(40, 'p'), "trainer");
  const int64_t bytes = index.BytesIfSet("llm", 3, long_pod);
  EXPECT_GT(bytes, 40);
  EXPECT_TRUE(index.SetRank("llm", 3, long_pod));
  EXPECT_FALSE(index.SetRank("llm", 3, long_pod));  // unchanged
  EXPECT_EQ(index.BytesIfSet("llm", 3, long_pod), 0);
  EXPECT_EQ(index.BytesIfSet("llm", 3, PodNames{}), -bytes);
  ASSERT_NE(index.OfRank("llm", 3), nullptr);
  EXPECT_EQ(index.OfRank("llm", 3)->pod, long_pod.pod);
  index.EraseJob("llm");
  EXPECT_EQ(index.OfRank("llm", 3), nullptr);
}

TEST(PodIndexTest, EachFindingGetsThePodItIsAbout) {
  const PodIndex ranks = TwoPods();
  std::vector<NodeSnapshot> nodes(1);
  nodes[0].node = "node-9";
  nodes[0].gpus.resize(2);
  nodes[0].gpus[0].set_index(0);
  nodes[0].gpus[1].set_index(1);
  nodes[0].gpus[1].mutable_kubernetes_pod()->set_namespace_("team-b");
  nodes[0].gpus[1].mutable_kubernetes_pod()->set_pod("notebook");
  nodes[0].gpus[1].mutable_kubernetes_pod()->set_container("jupyter");
  const GpuPodLookup gpus = GpuPodsOf(nodes);

  analysis::Finding straggler;
  straggler.job = "llm";
  straggler.rank = 5;
  EXPECT_EQ(AttributeFinding(straggler, &ranks, gpus), Pod("team-a", "worker-1", "trainer"));

  analysis::Finding slow_node;  // about the ranks of one pod
  slow_node.job = "llm";
  slow_node.rank = -1;
  slow_node.ranks = {0, 1, 2, 3};
  EXPECT_EQ(AttributeFinding(slow_node, &ranks, gpus), Pod("team-a", "worker-0", "trainer"));

  analysis::Finding stall;  // the whole job: only the namespace is common
  stall.job = "llm";
  stall.rank = -1;
  EXPECT_EQ(AttributeFinding(stall, &ranks, gpus), Pod("team-a", "", ""));

  analysis::Finding idle;  // a GPU no job reports on
  idle.rank = -1;
  idle.node = "node-9";
  idle.gpu = 1;
  EXPECT_EQ(AttributeFinding(idle, &ranks, gpus), Pod("team-b", "notebook", "jupyter"));
  idle.gpu = 0;
  EXPECT_TRUE(AttributeFinding(idle, &ranks, gpus).empty());

  analysis::Finding other_job;
  other_job.job = "unknown-job";
  other_job.rank = 2;
  EXPECT_TRUE(AttributeFinding(other_job, &ranks, gpus).empty());
  EXPECT_TRUE(AttributeFinding(straggler, nullptr, gpus).empty());
}

std::string Label(const prometheus::ClientMetric& m, const std::string& name) {
  for (const auto& l : m.label) {
    if (l.name == name) return l.value;
  }
  return "<absent>";
}

const prometheus::MetricFamily* Family(const std::vector<prometheus::MetricFamily>& fams,
                                       const std::string& name) {
  for (const auto& f : fams) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

TEST(PodIndexTest, StragglerFindingRankAndGpuSeriesCarryTheirPod) {
  StateSnapshot s;
  s.now_unix_nanos = 1'700'000'000'000'000'000;
  s.node_down_nanos = 15'000'000'000;
  s.rank_pods = std::make_shared<const PodIndex>(TwoPods());
  analysis::RankSnapshot slow;
  slow.rank = 5;
  slow.node = "node-1";
  slow.gpu = 1;
  slow.straggler = true;
  slow.busy_vs_median_ratio = 1.3;
  s.top_ranks.emplace_back("llm", slow);
  analysis::RankSnapshot unknown = slow;  // a rank whose steps name no pod
  unknown.rank = 9;
  unknown.straggler = false;
  s.top_ranks.emplace_back("llm", unknown);
  analysis::Finding f;
  f.kind = analysis::FindingKind::kStraggler;
  f.job = "llm";
  f.rank = 5;
  f.node = "node-1";
  f.gpu = 1;
  s.findings.push_back(f);
  NodeSnapshot node;
  node.node = "node-1";
  node.last_seen_unix_nanos = s.now_unix_nanos;
  node.gpus.resize(1);
  node.gpus[0].set_index(1);
  node.gpus[0].set_utilization_gpu_ratio(0.9);
  *node.gpus[0].mutable_kubernetes_pod() = v1::KubernetesPod();
  node.gpus[0].mutable_kubernetes_pod()->set_namespace_("team-a");
  node.gpus[0].mutable_kubernetes_pod()->set_pod("worker-1");
  node.gpus[0].mutable_kubernetes_pod()->set_container("trainer");
  s.nodes.push_back(node);

  const std::vector<prometheus::MetricFamily> fams = BuildMetricFamilies(s, {});
  const prometheus::MetricFamily* straggler = Family(fams, "stepwatch_straggler");
  ASSERT_NE(straggler, nullptr);
  ASSERT_EQ(straggler->metric.size(), 1u);
  EXPECT_EQ(Label(straggler->metric[0], "namespace"), "team-a");
  EXPECT_EQ(Label(straggler->metric[0], "pod"), "worker-1");
  EXPECT_EQ(Label(straggler->metric[0], "container"), "trainer");
  const prometheus::MetricFamily* finding = Family(fams, "stepwatch_finding");
  ASSERT_NE(finding, nullptr);
  EXPECT_EQ(Label(finding->metric[0], "namespace"), "team-a");
  EXPECT_EQ(Label(finding->metric[0], "pod"), "worker-1");
  const prometheus::MetricFamily* busy = Family(fams, "stepwatch_rank_busy_seconds");
  ASSERT_NE(busy, nullptr);
  ASSERT_EQ(busy->metric.size(), 2u);
  EXPECT_EQ(Label(busy->metric[0], "pod"), "worker-1");
  // Unknown: the label is there, empty, so that every series of the family has the same names.
  EXPECT_EQ(Label(busy->metric[1], "pod"), "");
  const prometheus::MetricFamily* util = Family(fams, "stepwatch_gpu_utilization_ratio");
  ASSERT_NE(util, nullptr);
  EXPECT_EQ(Label(util->metric[0], "namespace"), "team-a");
  EXPECT_EQ(Label(util->metric[0], "gpu"), "1");
  // Labels stay sorted by name, like every collector series.
  for (const auto* fam : {straggler, finding, busy, util}) {
    for (const auto& m : fam->metric) {
      EXPECT_TRUE(std::is_sorted(m.label.begin(), m.label.end(), [](const auto& a, const auto& b) {
        return a.name < b.name;
      })) << fam->name;
    }
  }
}

}  // namespace
}  // namespace stepwatch::collector
