// /metrics for the collector: a prometheus::Collectable that builds every family at scrape time
// from a snapshot of the collector's state, so series of expired jobs and nodes simply vanish and
// nothing is kept per step.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "collector/state.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace stepwatch::collector {

struct MetricsOptions {
  // At most this many stepwatch_finding series (one per active finding); the counts per
  // (job, kind, severity) in stepwatch_findings are always complete.
  int max_finding_series = 1000;
};

// Pure function of the snapshot, so that tests can check it without a server.
std::vector<prometheus::MetricFamily> BuildMetricFamilies(const StateSnapshot& snapshot,
                                                          const MetricsOptions& options);

class StateCollectable : public prometheus::Collectable {
 public:
  StateCollectable(const CollectorState* state, MetricsOptions options)
      : state_(state), options_(options) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const CollectorState* const state_;
  const MetricsOptions options_;
  // Findings left out of stepwatch_finding by max_finding_series, summed over scrapes.
  mutable std::atomic<uint64_t> finding_series_dropped_{0};
};

}  // namespace stepwatch::collector
