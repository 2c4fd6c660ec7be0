// The GPU and host metrics of /metrics, in one table that the agent (names prefixed
// "stepwatch_agent_") and the collector (prefixed "stepwatch_") both iterate, so that their name,
// type, help, labels and units cannot drift apart.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "prometheus/metric_type.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::metrics {

inline constexpr char kAgentPrefix[] = "stepwatch_agent_";
inline constexpr char kCollectorPrefix[] = "stepwatch_";

// Which endpoints export a metric. The agent exports every metric of the table.
enum class Scope {
  kAgentAndCollector,
  // Node-local diagnosis whose cardinality would not scale to a fleet's /metrics.
  kAgentOnly,
};

// Rank under the collector's --max-series: kHigh metrics of every GPU come before the node's
// other series; the rest follow in table order.
enum class Importance { kHigh, kNormal };

// One series: the values of the metric's `labels`, in order, and its value.
struct NodeSeries {
  std::vector<std::string> label_values;
  double value = 0;
};

template <typename Sample>
struct NodeMetric {
  // After the exporter's prefix, e.g. "gpu_utilization_ratio".
  const char* name;
  prometheus::MetricType type;
  const char* help;
  // Base unit the name ends with (before "_total"); "" for counts, bitmasks and info metrics.
  const char* unit;
  // Labels besides node (and gpu for GPU metrics); when set, `series` gives the series.
  std::vector<const char*> labels;
  // The value in base units; nullopt when the sample lacks the reading (then no series).
  std::optional<double> (*value)(const Sample&);
  // For metrics with labels: every series of one sample.
  std::vector<NodeSeries> (*series)(const Sample&);
  // GPU metrics: the reading's key in GpuSample.unavailable_metrics (gpu::kGpuMetricNames);
  // nullptr when the metric is not a driver reading.
  const char* reading;
  Importance importance;
  Scope scope;
};

using GpuMetric = NodeMetric<v1::GpuSample>;
using HostMetric = NodeMetric<v1::HostSample>;

// In the collector's order of importance: utilization, then SM activity, then the rest.
const std::vector<GpuMetric>& GpuMetrics();
const std::vector<HostMetric>& HostMetrics();

// The series of `metric` for one sample: none when the reading is absent.
std::vector<NodeSeries> SeriesOf(const GpuMetric& metric, const v1::GpuSample& sample);
std::vector<NodeSeries> SeriesOf(const HostMetric& metric, const v1::HostSample& sample);

// Calls f(const std::vector<std::string>& label_values, double value) for each series of
// `metric` in one sample, without allocating for metrics without labels (scrapes of large fleets
// call this millions of times).
template <typename Sample, typename F>
void ForEachSeries(const NodeMetric<Sample>& metric, const Sample& sample, F&& f) {
  if (metric.series == nullptr) {
    if (const std::optional<double> v = metric.value(sample)) f(std::vector<std::string>(), *v);
    return;
  }
  for (const NodeSeries& s : metric.series(sample)) f(s.label_values, s.value);
}

// How many series SeriesOf returns; cheap for metrics without labels.
size_t SeriesCount(const GpuMetric& metric, const v1::GpuSample& sample);
size_t SeriesCount(const HostMetric& metric, const v1::HostSample& sample);

template <typename Sample>
bool CollectorExports(const NodeMetric<Sample>& metric) {
  return metric.scope == Scope::kAgentAndCollector;
}

}  // namespace stepwatch::metrics
