// The agent's and the collector's /metrics must show the same GPU and host families (name after
// the prefix, type, help, labels and values) for the same samples; only the metrics the table
// marks agent-only may be missing from the collector.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/agent_metrics.h"
#include "collector/metrics.h"
#include "gtest/gtest.h"
#include "metrics/node_metric_table.h"

namespace stepwatch {
namespace {

using prometheus::MetricFamily;

constexpr char kNode[] = "node-1";

std::vector<v1::GpuSample> Gpus() {
  v1::GpuSample full;
  full.set_index(0);
  full.set_uuid("GPU-0");
  full.set_name("NVIDIA H100");
  full.set_utilization_gpu_ratio(0.9);
  full.set_utilization_memory_ratio(0.4);
  full.set_memory_used_bytes(uint64_t{40} << 30);
  full.set_memory_total_bytes(uint64_t{80} << 30);
  full.set_sm_clock_mhz(1410);
  full.set_sm_clock_max_mhz(1980);
  full.set_power_watts(650);
  full.set_power_limit_watts(700);
  full.set_temperature_celsius(71);
  full.set_throttle_reasons(0x20);
  full.set_pcie_tx_bytes_per_second(1e9);
  full.set_pcie_rx_bytes_per_second(2e9);
  full.set_nvlink_tx_bytes_per_second(3e9);
  full.set_nvlink_rx_bytes_per_second(4e9);
  full.set_sm_activity_ratio(0.8);
  full.set_dram_bandwidth_ratio(0.5);
  full.set_tensor_activity_ratio(0.6);
  full.add_pids(11);
  v1::GpuHealth* health = full.mutable_health();
  health->set_pcie_link_generation_current(4);
  health->set_pcie_link_generation_max(5);
  health->set_pcie_link_width_current(16);
  health->set_pcie_link_width_max(16);
  health->set_pcie_replays_total(2);
  health->mutable_ecc()->set_uncorrected_volatile(1);
  health->mutable_remapped_rows()->set_pending(true);
  v1::GpuHealth::NvLink* link = health->add_nvlinks();
  link->set_link(0);
  link->set_up(true);
  link->set_replay_errors_total(3);
  v1::GpuHealth::Xid* xid = health->add_xids();
  xid->set_xid(79);
  xid->set_count(1);
  xid->set_last_unix_nanos(1'700'000'000'000'000'000);
  v1::GpuSample bare;  // a GPU whose driver gives nothing optional
  bare.set_index(1);
  (*bare.mutable_unavailable_metrics())["processes"] = "gpu_lost";
  (*bare.mutable_unavailable_metrics())["utilization"] = "mig_enabled";
  return {full, bare};
}

v1::HostSample Host() {
  v1::HostSample h;
  h.set_cpu_utilization_ratio(0.25);
  h.set_cpu_count(96);
  h.set_memory_total_bytes(uint64_t{1} << 40);
  h.set_memory_available_bytes(uint64_t{1} << 39);
  h.set_network_receive_bytes_total(1000);
  h.set_network_transmit_bytes_total(2000);
  h.set_memory_bandwidth_bytes_per_second(5e10);
  h.set_memory_bandwidth_source("perf");
  v1::NicPort* full = h.add_nic_ports();
  full->set_device("mlx5_0:1");
  full->set_link_layer("InfiniBand");
  full->set_state(4);
  full->set_physical_state(5);
  full->set_rate_bytes_per_second(25e9);
  full->set_link_width(4);
  full->set_symbol_errors_total(3);
  full->set_receive_errors_total(1);
  full->set_link_downed_total(0);
  full->set_transmit_discards_total(2);
  full->set_transmit_wait_total(100);
  full->set_received_bytes_total(4000);
  full->set_transmitted_bytes_total(8000);
  (*full->mutable_hw_counters())["out_of_buffer"] = 7;
  v1::NicPort* bare = h.add_nic_ports();  // a port whose readings all failed
  bare->set_device("mlx5_1:1");
  bare->add_unavailable("state");
  h.set_nic_ports_omitted(1);
  return h;
}

std::vector<MetricFamily> AgentFamilies() {
  agent::AgentMetricsSources sources;
  sources.node = kNode;
  sources.samples = [] {
    agent::NodeReading n;
    n.node.set_nvml_available(true);
    n.node.set_gpu_count(2);
    n.gpus = Gpus();
    n.host = Host();
    return n;
  };
  return agent::AgentCollectable(std::move(sources)).Collect();
}

std::vector<MetricFamily> CollectorFamilies() {
  collector::StateSnapshot s;
  s.now_unix_nanos = 1'700'000'000'000'000'000;
  s.node_down_nanos = 15'000'000'000;
  collector::NodeSnapshot n;
  n.node = kNode;
  n.last_seen_unix_nanos = s.now_unix_nanos;
  n.info.set_nvml_available(true);
  n.gpus = Gpus();
  n.host = Host();
  s.nodes.push_back(n);
  // Every node's readings (by default only those of nodes and GPUs in findings).
  collector::MetricsOptions options;
  options.export_node_metrics = collector::NodeMetricsExport::kAll;
  return collector::BuildMetricFamilies(s, options);
}

struct Family {
  std::string type_and_help;
  std::set<std::string> label_names;
  // "label=value,..." with labels sorted by name -> value.
  std::map<std::string, double> series;
};

// The GPU and host families of one exposition, by name after `prefix`.
std::map<std::string, Family> NodeFamilies(const std::vector<MetricFamily>& families,
                                           const std::string& prefix) {
  std::map<std::string, Family> out;
  for (const MetricFamily& f : families) {
    if (!absl::StartsWith(f.name, prefix)) continue;
    const std::string name = f.name.substr(prefix.size());
    if (!absl::StartsWith(name, "gpu_") && !absl::StartsWith(name, "host_") &&
        !absl::StartsWith(name, "nic_")) {
      continue;
    }
    Family& family = out[name];
    family.type_and_help = absl::StrCat(static_cast<int>(f.type), " ", f.help);
    for (const prometheus::ClientMetric& m : f.metric) {
      std::vector<std::string> labels;
      std::set<std::string> names;
      for (const auto& l : m.label) {
        labels.push_back(absl::StrCat(l.name, "=", l.value));
        names.insert(l.name);
      }
      std::sort(labels.begin(), labels.end());
      if (family.series.empty()) family.label_names = names;
      EXPECT_EQ(names, family.label_names) << f.name;
      family.series[absl::StrJoin(labels, ",")] =
          f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  return out;
}

TEST(NodeMetricExportersTest, AgentAndCollectorShowTheSameGpuAndHostFamilies) {
  std::map<std::string, Family> agent = NodeFamilies(AgentFamilies(), metrics::kAgentPrefix);
  const std::map<std::string, Family> collector =
      NodeFamilies(CollectorFamilies(), metrics::kCollectorPrefix);

  // Every table metric shows (the samples have every reading), and nothing else.
  std::set<std::string> table, agent_only;
  for (const metrics::GpuMetric& m : metrics::GpuMetrics()) {
    table.insert(m.name);
    if (!metrics::CollectorExports(m)) agent_only.insert(m.name);
  }
  for (const metrics::HostMetric& m : metrics::HostMetrics()) {
    table.insert(m.name);
    if (!metrics::CollectorExports(m)) agent_only.insert(m.name);
  }
  std::set<std::string> agent_names, collector_names;
  for (const auto& [name, f] : agent) agent_names.insert(name);
  for (const auto& [name, f] : collector) collector_names.insert(name);
  EXPECT_EQ(agent_names, table);
  for (const std::string& name : agent_only) {
    EXPECT_EQ(collector.count(name), 0u) << name;
    agent.erase(name);
  }
  agent_names.clear();
  for (const auto& [name, f] : agent) agent_names.insert(name);
  ASSERT_EQ(agent_names, collector_names);

  for (const auto& [name, a] : agent) {
    const Family& c = collector.at(name);
    SCOPED_TRACE(name);
    EXPECT_EQ(a.type_and_help, c.type_and_help);
    EXPECT_EQ(a.label_names, c.label_names);
    EXPECT_TRUE(a.label_names.count("node") == 1);
    EXPECT_EQ(a.label_names.count("gpu"), absl::StartsWith(name, "gpu_") ? 1u : 0u);
    EXPECT_EQ(a.series, c.series);
  }
  // Spot checks that the comparison saw real series: units converted, absent readings left out.
  EXPECT_EQ(
      collector.at("gpu_sm_clock_hertz").series.at("container=,gpu=0,namespace=,node=node-1,pod="),
      1410e6);
  EXPECT_EQ(collector.at("gpu_utilization_ratio")
                .series.count("container=,gpu=1,namespace=,node=node-1,pod="),
            0u);
  EXPECT_EQ(
      collector.at("gpu_processes").series.count("container=,gpu=1,namespace=,node=node-1,pod="),
      0u);
  EXPECT_EQ(
      collector.at("host_memory_bandwidth_bytes_per_second").series.at("node=node-1,source=perf"),
      5e10);
  EXPECT_EQ(collector.at("nic_port_rate_bytes_per_second").series.at("device=mlx5_0:1,node=node-1"),
            25e9);
  EXPECT_EQ(collector.at("nic_port_errors_total")
                .series.at("counter=symbol_error,device=mlx5_0:1,node=node-1"),
            3);
  EXPECT_EQ(collector.at("nic_port_up").series.count("device=mlx5_1:1,node=node-1"), 0u);
}

}  // namespace
}  // namespace stepwatch
