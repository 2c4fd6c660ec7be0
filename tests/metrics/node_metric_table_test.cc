#include "metrics/node_metric_table.h"

#include <iterator>
#include <regex>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gpu/gpu_source.h"
#include "gtest/gtest.h"

namespace stepwatch::metrics {
namespace {

using prometheus::MetricType;

// Every optional reading set, in the proto's own units.
v1::GpuSample FullGpuSample() {
  v1::GpuSample g;
  g.set_index(3);
  g.set_uuid("GPU-3");
  g.set_name("NVIDIA H100");
  g.set_utilization_gpu_ratio(0.9);
  g.set_utilization_memory_ratio(0.4);
  g.set_memory_used_bytes(uint64_t{40} << 30);
  g.set_memory_total_bytes(uint64_t{80} << 30);
  g.set_sm_clock_mhz(1410);
  g.set_sm_clock_max_mhz(1980);
  g.set_power_watts(650);
  g.set_power_limit_watts(700);
  g.set_temperature_celsius(71);
  g.set_throttle_reasons(0x20);
  g.set_pcie_tx_bytes_per_second(1e9);
  g.set_pcie_rx_bytes_per_second(2e9);
  g.set_nvlink_tx_bytes_per_second(3e9);
  g.set_nvlink_rx_bytes_per_second(4e9);
  g.set_sm_activity_ratio(0.8);
  g.set_dram_bandwidth_ratio(0.5);
  g.set_tensor_activity_ratio(0.6);
  g.add_pids(11);
  g.add_pids(12);
  return g;
}

v1::HostSample FullHostSample() {
  v1::HostSample h;
  h.set_cpu_utilization_ratio(0.25);
  h.set_cpu_count(96);
  h.set_memory_total_bytes(uint64_t{1} << 40);
  h.set_memory_available_bytes(uint64_t{1} << 39);
  h.set_network_receive_bytes_total(1000);
  h.set_network_transmit_bytes_total(2000);
  h.set_memory_bandwidth_bytes_per_second(5e10);
  h.set_memory_bandwidth_source("resctrl");
  return h;
}

// The checks every table entry must pass, whichever sample it reads.
template <typename Metric>
void CheckEntry(const Metric& m, const char* family_prefix) {
  static const std::regex kName("[a-zA-Z_:][a-zA-Z0-9_:]*");
  static const std::regex kLabel("[a-zA-Z_][a-zA-Z0-9_]*");
  const std::string name = m.name;
  SCOPED_TRACE(name);
  EXPECT_TRUE(absl::StartsWith(name, family_prefix));
  for (const char* prefix : {kAgentPrefix, kCollectorPrefix}) {
    EXPECT_TRUE(std::regex_match(absl::StrCat(prefix, name), kName));
  }
  EXPECT_FALSE(std::string(m.help).empty());
  EXPECT_TRUE(absl::EndsWith(m.help, ".")) << m.help;
  EXPECT_TRUE(m.type == MetricType::Gauge || m.type == MetricType::Counter);
  EXPECT_EQ(m.type == MetricType::Counter, absl::EndsWith(name, "_total"));
  // Base units in the name (Prometheus naming): *_ratio, *_bytes, *_hertz, ...
  const std::string unit = m.unit;
  if (!unit.empty()) {
    const std::string suffix =
        absl::StrCat("_", unit, m.type == MetricType::Counter ? "_total" : "");
    EXPECT_TRUE(absl::EndsWith(name, suffix)) << suffix;
  }
  for (const char* not_base : {"_mhz", "_megahertz", "_percent", "_kib", "_mib", "_milliwatts"}) {
    EXPECT_FALSE(absl::StrContains(name, not_base)) << not_base;
  }
  // Exactly one way to read the sample: a plain value, or series with labels.
  EXPECT_NE(m.value == nullptr, m.series == nullptr);
  EXPECT_EQ(m.labels.empty(), m.series == nullptr);
  std::set<std::string> labels;
  for (const char* label : m.labels) {
    EXPECT_TRUE(std::regex_match(label, kLabel)) << label;
    EXPECT_FALSE(absl::StartsWith(label, "__")) << label;
    EXPECT_TRUE(labels.insert(label).second) << "duplicate label " << label;
  }
  // node and gpu are added by the exporters.
  EXPECT_EQ(labels.count("node"), 0u);
  EXPECT_EQ(labels.count("gpu"), 0u);
}

TEST(NodeMetricTableTest, EntriesAreWellFormedAndUnique) {
  std::set<std::string> names;
  for (const GpuMetric& m : GpuMetrics()) {
    CheckEntry(m, "gpu_");
    EXPECT_TRUE(names.insert(m.name).second) << "duplicate " << m.name;
  }
  for (const HostMetric& m : HostMetrics()) {
    CheckEntry(m, absl::StartsWith(m.name, "nic_") ? "nic_" : "host_");
    EXPECT_TRUE(names.insert(m.name).second) << "duplicate " << m.name;
    EXPECT_EQ(m.reading, nullptr) << m.name;
    EXPECT_EQ(m.importance, Importance::kNormal) << m.name;
  }
  EXPECT_GE(GpuMetrics().size(), 18u);
  EXPECT_GE(HostMetrics().size(), 7u);
}

// Under the collector's --max-series, utilization then SM activity come before every other GPU
// series.
TEST(NodeMetricTableTest, UtilizationAndSmActivityRankFirst) {
  const std::vector<GpuMetric>& t = GpuMetrics();
  ASSERT_GE(t.size(), 2u);
  EXPECT_STREQ(t[0].name, "gpu_utilization_ratio");
  EXPECT_STREQ(t[1].name, "gpu_sm_activity_ratio");
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].importance == Importance::kHigh, i < 2) << t[i].name;
  }
}

// The readings named by the table are exactly those whose availability GpuSample reports.
TEST(NodeMetricTableTest, ReadingsAgreeWithGpuSourceNames) {
  const std::set<std::string> source(std::begin(gpu::kGpuMetricNames),
                                     std::end(gpu::kGpuMetricNames));
  EXPECT_EQ(source.size(), std::size(gpu::kGpuMetricNames)) << "duplicate reading name";
  std::set<std::string> table;
  for (const GpuMetric& m : GpuMetrics()) {
    if (m.reading == nullptr) continue;
    EXPECT_EQ(source.count(m.reading), 1u) << m.name << " reads unknown " << m.reading;
    table.insert(m.reading);
  }
  EXPECT_EQ(table, source);
}

double ValueOf(const GpuMetric& m, const v1::GpuSample& g) {
  const std::vector<NodeSeries> s = SeriesOf(m, g);
  EXPECT_EQ(s.size(), 1u) << m.name;
  return s.empty() ? -1 : s[0].value;
}

const GpuMetric& Gpu(const std::string& name) {
  for (const GpuMetric& m : GpuMetrics()) {
    if (m.name == name) return m;
  }
  ADD_FAILURE() << "no " << name;
  return GpuMetrics().front();
}

const HostMetric& Host(const std::string& name) {
  for (const HostMetric& m : HostMetrics()) {
    if (m.name == name) return m;
  }
  ADD_FAILURE() << "no " << name;
  return HostMetrics().front();
}

TEST(NodeMetricTableTest, ReadsEachFieldInBaseUnits) {
  const v1::GpuSample g = FullGpuSample();
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_utilization_ratio"), g), 0.9);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_memory_utilization_ratio"), g), 0.4);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_sm_clock_hertz"), g), 1410e6);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_sm_clock_max_hertz"), g), 1980e6);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_memory_used_bytes"), g), 40.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_memory_total_bytes"), g), 80.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_power_watts"), g), 650);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_power_limit_watts"), g), 700);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_temperature_celsius"), g), 71);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_throttle_reasons"), g), 0x20);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_pcie_transmit_bytes_per_second"), g), 1e9);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_pcie_receive_bytes_per_second"), g), 2e9);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_nvlink_transmit_bytes_per_second"), g), 3e9);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_nvlink_receive_bytes_per_second"), g), 4e9);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_sm_activity_ratio"), g), 0.8);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_dram_bandwidth_ratio"), g), 0.5);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_tensor_activity_ratio"), g), 0.6);
  EXPECT_DOUBLE_EQ(ValueOf(Gpu("gpu_processes"), g), 2);
  const std::vector<NodeSeries> info = SeriesOf(Gpu("gpu_info"), g);
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].label_values, (std::vector<std::string>{"GPU-3", "NVIDIA H100"}));

  const v1::HostSample h = FullHostSample();
  auto host = [&](const std::string& name) {
    const std::vector<NodeSeries> s = SeriesOf(Host(name), h);
    EXPECT_EQ(s.size(), 1u) << name;
    return s.empty() ? -1 : s[0].value;
  };
  EXPECT_DOUBLE_EQ(host("host_cpu_utilization_ratio"), 0.25);
  EXPECT_DOUBLE_EQ(host("host_cpus"), 96);
  EXPECT_DOUBLE_EQ(host("host_memory_total_bytes"), 1099511627776.0);
  EXPECT_DOUBLE_EQ(host("host_memory_available_bytes"), 549755813888.0);
  EXPECT_DOUBLE_EQ(host("host_network_receive_bytes_total"), 1000);
  EXPECT_DOUBLE_EQ(host("host_network_transmit_bytes_total"), 2000);
  EXPECT_DOUBLE_EQ(host("host_memory_bandwidth_bytes_per_second"), 5e10);
  EXPECT_EQ(SeriesOf(Host("host_memory_bandwidth_bytes_per_second"), h)[0].label_values,
            (std::vector<std::string>{"resctrl"}));
}

// Absent readings give no series rather than a made-up zero.
TEST(NodeMetricTableTest, AbsentReadingsGiveNoSeries) {
  v1::GpuSample g;
  g.set_index(0);
  (*g.mutable_unavailable_metrics())["processes"] = "error";
  for (const GpuMetric& m : GpuMetrics()) {
    const std::string name = m.name;
    if (name == "gpu_info" || name == "gpu_metric_available") continue;
    EXPECT_EQ(SeriesCount(m, g), 0u) << name;
    EXPECT_TRUE(SeriesOf(m, g).empty()) << name;
  }
  const v1::HostSample h;
  for (const HostMetric& m : HostMetrics()) {
    EXPECT_EQ(SeriesCount(m, h), 0u) << m.name;
  }
}

TEST(NodeMetricTableTest, MetricAvailabilityHasOneSeriesPerReading) {
  v1::GpuSample g = FullGpuSample();
  (*g.mutable_unavailable_metrics())["sm_activity"] = "no_permission";
  const GpuMetric& m = Gpu("gpu_metric_available");
  const std::vector<NodeSeries> series = SeriesOf(m, g);
  ASSERT_EQ(series.size(), std::size(gpu::kGpuMetricNames));
  EXPECT_EQ(SeriesCount(m, g), series.size());
  int unavailable = 0;
  for (const NodeSeries& s : series) {
    ASSERT_EQ(s.label_values.size(), 2u);
    if (s.label_values[0] == "sm_activity") {
      EXPECT_EQ(s.label_values[1], "no_permission");
      EXPECT_EQ(s.value, 0);
      ++unavailable;
    } else {
      EXPECT_EQ(s.label_values[1], "ok") << s.label_values[0];
      EXPECT_EQ(s.value, 1);
    }
  }
  EXPECT_EQ(unavailable, 1);
}

}  // namespace
}  // namespace stepwatch::metrics
