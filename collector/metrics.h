// /metrics for the collector: a prometheus::Collectable that builds every family at scrape time
// from a snapshot of the collector's state, so series of expired jobs and nodes simply vanish and
// nothing is kept per step.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "collector/published_state.h"
#include "collector/state.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace stepwatch::collector {

// Which GPU and host readings /metrics re-exports (--export-node-metrics).
enum class NodeMetricsExport {
  // Those of the nodes and GPUs current findings name (InvolvedNodes), with stepwatch_node_up of
  // those nodes and of every quiet one: bounded by the findings, whatever the fleet's size. The
  // raw view of every node is on its agent's /metrics.
  kFindings,
  // Every node's and GPU's readings: a small fleet with one collector scraped alone.
  kAll,
};

struct MetricsOptions {
  NodeMetricsExport export_node_metrics = NodeMetricsExport::kFindings;
  // At most this many stepwatch_finding series (one per active finding); the counts per
  // (job, kind, severity) in stepwatch_findings are always complete.
  int max_finding_series = 1000;
  // At most this many series in all (0: no cap), the collector's own health series aside. They
  // are filled in order of importance: finding counts, findings and flagged ranks, job-level
  // series, per-rank series, node up, every GPU's utilization then SM activity, the other node
  // and GPU readings, host readings. With kAll, the default keeps 10,000 nodes of 8 GPUs under
  // 10 MB of exposition with every node's up and every GPU's utilization (docs/performance.md).
  int max_series = 100000;
};

// Series left out by a cap in one build, by family label ("rank", "finding", "job", "node",
// "gpu", "host").
using SeriesDrops = std::map<std::string, uint64_t>;

// Pure function of the snapshot, so that tests can check it without a server. The series-dropped
// counters show the snapshot's counters plus this build's drops, which are also added to
// `*dropped` when it is not null.
std::vector<prometheus::MetricFamily> BuildMetricFamilies(const StateSnapshot& snapshot,
                                                          const MetricsOptions& options,
                                                          SeriesDrops* dropped = nullptr);

class StateCollectable : public prometheus::Collectable {
 public:
  StateCollectable(const CollectorState* state, MetricsOptions options)
      : state_(state), options_(options) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const CollectorState* const state_;
  const MetricsOptions options_;
  // Series left out by max_finding_series and max_series, summed over scrapes.
  mutable absl::Mutex mu_;
  mutable SeriesDrops dropped_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stepwatch::collector
