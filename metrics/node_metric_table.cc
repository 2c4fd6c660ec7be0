#include "metrics/node_metric_table.h"

#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/gpu_source.h"
#include "metrics/gpu_health_metric_table.h"
#include "metrics/nic_metric_table.h"

namespace stepwatch::metrics {
namespace {

using prometheus::MetricType;
using v1::GpuSample;
using v1::HostSample;

constexpr double kHertzPerMegahertz = 1e6;

// An optional proto field in base units, or nullopt when it is unset.
template <typename T>
std::optional<double> If(bool has, T value, double scale = 1) {
  if (!has) return std::nullopt;
  return static_cast<double>(value) * scale;
}

// A GPU gauge without labels beyond node and gpu, read from the driver reading `reading`.
GpuMetric Gpu(const char* name, const char* help, const char* unit, const char* reading,
              std::optional<double> (*value)(const GpuSample&),
              Importance importance = Importance::kNormal) {
  return GpuMetric{name,  MetricType::Gauge, help,    unit,       {},
                   value, nullptr,           reading, importance, Scope::kAgentAndCollector};
}

HostMetric Host(const char* name, MetricType type, const char* help, const char* unit,
                std::optional<double> (*value)(const HostSample&)) {
  return HostMetric{name,
                    type,
                    help,
                    unit,
                    {},
                    value,
                    nullptr,
                    nullptr,
                    Importance::kNormal,
                    Scope::kAgentAndCollector};
}

// How busy the GPU is: kernels, SMs, memory, tensor cores, and the processes on it.
std::vector<GpuMetric> ActivityMetrics() {
  return {
      Gpu(
          "gpu_utilization_ratio", "Fraction of time a kernel was running (NVML utilization.gpu).",
          "ratio", "utilization",
          [](const GpuSample& g) {
            return If(g.has_utilization_gpu_ratio(), g.utilization_gpu_ratio());
          },
          Importance::kHigh),
      Gpu(
          "gpu_sm_activity_ratio", "Fraction of SM cycles with work resident (GPM).", "ratio",
          "sm_activity",
          [](const GpuSample& g) { return If(g.has_sm_activity_ratio(), g.sm_activity_ratio()); },
          Importance::kHigh),
      // A GPU whose process list failed gives no series rather than a misleading 0.
      Gpu("gpu_processes", "Processes with a compute context on the GPU.", "", "processes",
          [](const GpuSample& g) {
            return If(g.unavailable_metrics().count("processes") == 0, g.pids_size());
          }),
      Gpu("gpu_memory_utilization_ratio", "Fraction of time device memory was read or written.",
          "ratio", "utilization",
          [](const GpuSample& g) {
            return If(g.has_utilization_memory_ratio(), g.utilization_memory_ratio());
          }),
      Gpu("gpu_dram_bandwidth_ratio", "Fraction of peak DRAM bandwidth used (GPM).", "ratio",
          "dram_bandwidth",
          [](const GpuSample& g) {
            return If(g.has_dram_bandwidth_ratio(), g.dram_bandwidth_ratio());
          }),
      Gpu("gpu_tensor_activity_ratio", "Fraction of cycles the tensor cores were active (GPM).",
          "ratio", "tensor_activity",
          [](const GpuSample& g) {
            return If(g.has_tensor_activity_ratio(), g.tensor_activity_ratio());
          }),
  };
}

// Clocks, device memory, power, temperature and throttling.
std::vector<GpuMetric> ClockMemoryAndPowerMetrics() {
  return {
      Gpu("gpu_sm_clock_hertz", "SM clock.", "hertz", "sm_clock",
          [](const GpuSample& g) {
            return If(g.has_sm_clock_mhz(), g.sm_clock_mhz(), kHertzPerMegahertz);
          }),
      Gpu("gpu_sm_clock_max_hertz", "Maximum SM clock.", "hertz", "sm_clock_max",
          [](const GpuSample& g) {
            return If(g.has_sm_clock_max_mhz(), g.sm_clock_max_mhz(), kHertzPerMegahertz);
          }),
      Gpu("gpu_memory_used_bytes", "Device memory in use.", "bytes", "memory",
          [](const GpuSample& g) { return If(g.has_memory_used_bytes(), g.memory_used_bytes()); }),
      Gpu("gpu_memory_total_bytes", "Device memory size.", "bytes", "memory",
          [](const GpuSample& g) {
            return If(g.has_memory_total_bytes(), g.memory_total_bytes());
          }),
      Gpu("gpu_power_watts", "Power draw.", "watts", "power",
          [](const GpuSample& g) { return If(g.has_power_watts(), g.power_watts()); }),
      Gpu("gpu_power_limit_watts", "Enforced power limit.", "watts", "power_limit",
          [](const GpuSample& g) { return If(g.has_power_limit_watts(), g.power_limit_watts()); }),
      Gpu("gpu_temperature_celsius", "GPU core temperature.", "celsius", "temperature",
          [](const GpuSample& g) {
            return If(g.has_temperature_celsius(), g.temperature_celsius());
          }),
      Gpu("gpu_throttle_reasons", "NVML clocks throttle reasons bitmask (0: not throttled).", "",
          "throttle_reasons",
          [](const GpuSample& g) { return If(g.has_throttle_reasons(), g.throttle_reasons()); }),
  };
}

// PCIe and NVLink throughput.
std::vector<GpuMetric> InterconnectMetrics() {
  return {
      Gpu("gpu_pcie_transmit_bytes_per_second", "PCIe transmit throughput.", "bytes_per_second",
          "pcie",
          [](const GpuSample& g) {
            return If(g.has_pcie_tx_bytes_per_second(), g.pcie_tx_bytes_per_second());
          }),
      Gpu("gpu_pcie_receive_bytes_per_second", "PCIe receive throughput.", "bytes_per_second",
          "pcie",
          [](const GpuSample& g) {
            return If(g.has_pcie_rx_bytes_per_second(), g.pcie_rx_bytes_per_second());
          }),
      Gpu("gpu_nvlink_transmit_bytes_per_second", "NVLink transmit throughput, all links.",
          "bytes_per_second", "nvlink",
          [](const GpuSample& g) {
            return If(g.has_nvlink_tx_bytes_per_second(), g.nvlink_tx_bytes_per_second());
          }),
      Gpu("gpu_nvlink_receive_bytes_per_second", "NVLink receive throughput, all links.",
          "bytes_per_second", "nvlink",
          [](const GpuSample& g) {
            return If(g.has_nvlink_rx_bytes_per_second(), g.nvlink_rx_bytes_per_second());
          }),
  };
}

// The GPU's identity: one series labelled with its uuid and name.
GpuMetric GpuInfoMetric() {
  return GpuMetric{"gpu_info",
                   MetricType::Gauge,
                   "GPU identity; always 1.",
                   "",
                   {"uuid", "name"},
                   nullptr,
                   [](const GpuSample& g) {
                     return std::vector<NodeSeries>{{{g.uuid(), g.name()}, 1}};
                   },
                   nullptr,
                   Importance::kNormal,
                   Scope::kAgentAndCollector};
}

// Which readings the driver gives for the GPU, and why not.
GpuMetric MetricAvailableMetric() {
  // 21 series per GPU: useful on the node, too many for a fleet's /metrics, where an absent
  // series already says that the reading is missing.
  return GpuMetric{
      "gpu_metric_available",
      MetricType::Gauge,
      "1 when the driver gives this reading for the GPU; reason says why not (not_supported, "
      "no_permission, missing_entry_point, mig_enabled, gpu_lost, error).",
      "",
      {"metric", "reason"},
      nullptr,
      [](const GpuSample& g) {
        std::vector<NodeSeries> out;
        for (const char* reading : gpu::kGpuMetricNames) {
          const auto it = g.unavailable_metrics().find(reading);
          const bool available = it == g.unavailable_metrics().end();
          out.push_back(
              {{reading, available ? std::string("ok") : it->second}, available ? 1.0 : 0.0});
        }
        return out;
      },
      nullptr,
      Importance::kNormal,
      Scope::kAgentOnly};
}

void Append(std::vector<GpuMetric> more, std::vector<GpuMetric>* t) {
  t->insert(t->end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
}

std::vector<GpuMetric> MakeGpuMetrics() {
  std::vector<GpuMetric> t = ActivityMetrics();
  Append(ClockMemoryAndPowerMetrics(), &t);
  Append(InterconnectMetrics(), &t);
  t.push_back(GpuInfoMetric());
  AppendGpuHealthMetrics(&t);
  t.push_back(MetricAvailableMetric());
  return t;
}

std::vector<HostMetric> MakeHostMetrics() {
  std::vector<HostMetric> t = {
      Host("host_cpu_utilization_ratio", MetricType::Gauge,
           "Busy fraction of all CPUs over the last interval.", "ratio",
           [](const HostSample& h) {
             return If(h.has_cpu_utilization_ratio(), h.cpu_utilization_ratio());
           }),
      // cpu_count 0 means the count was not read.
      Host("host_cpus", MetricType::Gauge, "Number of CPUs.", "",
           [](const HostSample& h) { return If(h.cpu_count() > 0, h.cpu_count()); }),
      Host("host_memory_total_bytes", MetricType::Gauge, "Host memory size.", "bytes",
           [](const HostSample& h) {
             return If(h.has_memory_total_bytes(), h.memory_total_bytes());
           }),
      Host("host_memory_available_bytes", MetricType::Gauge,
           "Host memory available (MemAvailable).", "bytes",
           [](const HostSample& h) {
             return If(h.has_memory_available_bytes(), h.memory_available_bytes());
           }),
      Host("host_network_receive_bytes_total", MetricType::Counter,
           "Bytes received on non-loopback interfaces since boot.", "bytes",
           [](const HostSample& h) {
             return If(h.has_network_receive_bytes_total(), h.network_receive_bytes_total());
           }),
      Host("host_network_transmit_bytes_total", MetricType::Counter,
           "Bytes sent on non-loopback interfaces since boot.", "bytes",
           [](const HostSample& h) {
             return If(h.has_network_transmit_bytes_total(), h.network_transmit_bytes_total());
           }),
  };
  t.push_back(HostMetric{
      "host_memory_bandwidth_bytes_per_second",
      MetricType::Gauge,
      "Host memory bandwidth; source is resctrl or perf (uncore counters).",
      "bytes_per_second",
      {"source"},
      nullptr,
      [](const HostSample& h) {
        std::vector<NodeSeries> out;
        if (h.has_memory_bandwidth_bytes_per_second()) {
          out.push_back({{h.memory_bandwidth_source()}, h.memory_bandwidth_bytes_per_second()});
        }
        return out;
      },
      nullptr,
      Importance::kNormal,
      Scope::kAgentAndCollector});
  AppendNicMetrics(&t);
  return t;
}

template <typename Sample>
std::vector<NodeSeries> Series(const NodeMetric<Sample>& metric, const Sample& sample) {
  std::vector<NodeSeries> out;
  ForEachSeries(metric, sample, [&](const std::vector<std::string>& labels, double value) {
    out.push_back({labels, value});
  });
  return out;
}

template <typename Sample>
size_t Count(const NodeMetric<Sample>& metric, const Sample& sample) {
  if (metric.series != nullptr) return metric.series(sample).size();
  return metric.value(sample).has_value() ? 1 : 0;
}

}  // namespace

const std::vector<GpuMetric>& GpuMetrics() {
  static const std::vector<GpuMetric>* const table = new std::vector<GpuMetric>(MakeGpuMetrics());
  return *table;
}

const std::vector<HostMetric>& HostMetrics() {
  static const std::vector<HostMetric>* const table =
      new std::vector<HostMetric>(MakeHostMetrics());
  return *table;
}

std::vector<NodeSeries> SeriesOf(const GpuMetric& metric, const v1::GpuSample& sample) {
  return Series(metric, sample);
}
std::vector<NodeSeries> SeriesOf(const HostMetric& metric, const v1::HostSample& sample) {
  return Series(metric, sample);
}
size_t SeriesCount(const GpuMetric& metric, const v1::GpuSample& sample) {
  return Count(metric, sample);
}
size_t SeriesCount(const HostMetric& metric, const v1::HostSample& sample) {
  return Count(metric, sample);
}

}  // namespace stepwatch::metrics
