#include "metrics/gpu_health_metric_table.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stepwatch::metrics {
namespace {

using prometheus::MetricType;
using v1::GpuHealth;
using v1::GpuSample;

GpuMetric Labelled(const char* name, MetricType type, const char* help, const char* unit,
                   std::vector<const char*> labels,
                   std::vector<NodeSeries> (*series)(const GpuSample&), const char* reading,
                   Scope scope = Scope::kAgentAndCollector) {
  return GpuMetric{
      name, type, help, unit, std::move(labels), nullptr, series, reading, Importance::kNormal,
      scope};
}

GpuMetric Plain(const char* name, MetricType type, const char* help, const char* reading,
                std::optional<double> (*value)(const GpuSample&)) {
  return GpuMetric{name,
                   type,
                   help,
                   "",
                   {},
                   value,
                   nullptr,
                   reading,
                   Importance::kNormal,
                   Scope::kAgentAndCollector};
}

// kind="current" and kind="max" of a PCIe link property, each where it was read.
std::vector<NodeSeries> CurrentAndMax(bool has_current, uint32_t current, bool has_max,
                                      uint32_t max) {
  std::vector<NodeSeries> out;
  if (has_current) out.push_back({{"current"}, static_cast<double>(current)});
  if (has_max) out.push_back({{"max"}, static_cast<double>(max)});
  return out;
}

std::vector<NodeSeries> PcieGeneration(const GpuSample& g) {
  const GpuHealth& h = g.health();
  return CurrentAndMax(h.has_pcie_link_generation_current(), h.pcie_link_generation_current(),
                       h.has_pcie_link_generation_max(), h.pcie_link_generation_max());
}

std::vector<NodeSeries> PcieWidth(const GpuSample& g) {
  const GpuHealth& h = g.health();
  return CurrentAndMax(h.has_pcie_link_width_current(), h.pcie_link_width_current(),
                       h.has_pcie_link_width_max(), h.pcie_link_width_max());
}

std::vector<NodeSeries> EccErrors(const GpuSample& g) {
  if (!g.health().has_ecc()) return {};
  const GpuHealth::Ecc& e = g.health().ecc();
  return {{{"corrected", "volatile"}, static_cast<double>(e.corrected_volatile())},
          {{"uncorrected", "volatile"}, static_cast<double>(e.uncorrected_volatile())},
          {{"corrected", "aggregate"}, static_cast<double>(e.corrected_aggregate())},
          {{"uncorrected", "aggregate"}, static_cast<double>(e.uncorrected_aggregate())}};
}

std::vector<NodeSeries> RemappedRows(const GpuSample& g) {
  if (!g.health().has_remapped_rows()) return {};
  const GpuHealth::RemappedRows& r = g.health().remapped_rows();
  return {{{"corrected"}, static_cast<double>(r.corrected())},
          {{"uncorrected"}, static_cast<double>(r.uncorrected())}};
}

std::vector<NodeSeries> NvlinkUp(const GpuSample& g) {
  std::vector<NodeSeries> out;
  for (const GpuHealth::NvLink& l : g.health().nvlinks()) {
    out.push_back({{absl::StrCat(l.link())}, l.up() ? 1.0 : 0.0});
  }
  return out;
}

std::vector<NodeSeries> NvlinkErrors(const GpuSample& g) {
  std::vector<NodeSeries> out;
  for (const GpuHealth::NvLink& l : g.health().nvlinks()) {
    const std::string link = absl::StrCat(l.link());
    const std::pair<const char*, std::optional<uint64_t>> counters[] = {
        {"replay",
         l.has_replay_errors_total() ? std::optional(l.replay_errors_total()) : std::nullopt},
        {"recovery",
         l.has_recovery_errors_total() ? std::optional(l.recovery_errors_total()) : std::nullopt},
        {"crc_flit",
         l.has_crc_flit_errors_total() ? std::optional(l.crc_flit_errors_total()) : std::nullopt},
        {"crc_data",
         l.has_crc_data_errors_total() ? std::optional(l.crc_data_errors_total()) : std::nullopt},
    };
    for (const auto& [type, value] : counters) {
      if (value) out.push_back({{link, type}, static_cast<double>(*value)});
    }
  }
  return out;
}

std::vector<NodeSeries> XidEvents(const GpuSample& g) {
  std::vector<NodeSeries> out;
  for (const GpuHealth::Xid& x : g.health().xids()) {
    out.push_back({{absl::StrCat(x.xid())}, static_cast<double>(x.count())});
  }
  return out;
}

std::vector<NodeSeries> XidLastEvent(const GpuSample& g) {
  std::vector<NodeSeries> out;
  for (const GpuHealth::Xid& x : g.health().xids()) {
    out.push_back({{absl::StrCat(x.xid())}, static_cast<double>(x.last_unix_nanos()) / 1e9});
  }
  return out;
}

}  // namespace

void AppendGpuHealthMetrics(std::vector<GpuMetric>* table) {
  std::vector<GpuMetric>& t = *table;
  t.push_back(Labelled("gpu_pcie_link_generation", MetricType::Gauge,
                       "PCIe link generation, as trained now (kind=current) and the most the GPU "
                       "and its slot allow (kind=max); an idle GPU may train down to save power.",
                       "", {"kind"}, PcieGeneration, "pcie_link"));
  t.push_back(Labelled("gpu_pcie_link_width", MetricType::Gauge,
                       "PCIe link width in lanes, now (kind=current) and at most (kind=max).", "",
                       {"kind"}, PcieWidth, "pcie_link"));
  t.push_back(Plain("gpu_pcie_replays_total", MetricType::Counter,
                    "PCIe replays (retransmissions after link errors) since the driver loaded.",
                    "pcie_replays", [](const GpuSample& g) -> std::optional<double> {
                      if (!g.health().has_pcie_replays_total()) return std::nullopt;
                      return static_cast<double>(g.health().pcie_replays_total());
                    }));
  t.push_back(Labelled("gpu_ecc_errors_total", MetricType::Counter,
                       "ECC errors by type (corrected, uncorrected) and counter (volatile: since "
                       "the driver loaded; aggregate: over the GPU's life).",
                       "", {"type", "counter"}, EccErrors, "ecc"));
  t.push_back(Labelled("gpu_remapped_rows", MetricType::Gauge,
                       "Memory rows remapped for correctable (type=corrected) and uncorrectable "
                       "(type=uncorrected) errors.",
                       "", {"type"}, RemappedRows, "remapped_rows"));
  t.push_back(Plain("gpu_row_remap_pending", MetricType::Gauge,
                    "1 while a row remap waits for the next GPU reset.", "remapped_rows",
                    [](const GpuSample& g) -> std::optional<double> {
                      if (!g.health().has_remapped_rows()) return std::nullopt;
                      return g.health().remapped_rows().pending() ? 1.0 : 0.0;
                    }));
  t.push_back(Plain("gpu_row_remap_failure", MetricType::Gauge,
                    "1 when a row remap failed (the GPU needs replacing).", "remapped_rows",
                    [](const GpuSample& g) -> std::optional<double> {
                      if (!g.health().has_remapped_rows()) return std::nullopt;
                      return g.health().remapped_rows().failure() ? 1.0 : 0.0;
                    }));
  t.push_back(Labelled("gpu_nvlink_up", MetricType::Gauge, "1 while the NVLink is up.", "",
                       {"link"}, NvlinkUp, "nvlink_state", Scope::kAgentOnly));
  t.push_back(Labelled("gpu_nvlink_errors_total", MetricType::Counter,
                       "NVLink data-link errors since the driver loaded, by type (replay, "
                       "recovery, crc_flit, crc_data).",
                       "", {"link", "type"}, NvlinkErrors, "nvlink_errors", Scope::kAgentOnly));
  t.push_back(Labelled("gpu_xid_events_total", MetricType::Counter,
                       "Xid errors the driver reported since the agent started, by Xid code.", "",
                       {"xid"}, XidEvents, "xid"));
  t.push_back(Labelled("gpu_xid_last_event_timestamp_seconds", MetricType::Gauge,
                       "When the agent read the last Xid error of this code, Unix time.", "seconds",
                       {"xid"}, XidLastEvent, "xid"));
  t.push_back(Plain("gpu_xid_events_dropped_total", MetricType::Counter,
                    "Xid errors of codes beyond the 16 the agent keeps per GPU.", "xid",
                    [](const GpuSample& g) -> std::optional<double> {
                      if (!g.has_health() || g.unavailable_metrics().count("xid") > 0) {
                        return std::nullopt;
                      }
                      return static_cast<double>(g.health().xid_events_dropped());
                    }));
}

}  // namespace stepwatch::metrics
