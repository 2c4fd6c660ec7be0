#include "metrics/nic_metric_table.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

namespace stepwatch::metrics {
namespace {

using prometheus::MetricType;
using v1::HostSample;
using v1::NicPort;

template <typename F>
std::vector<NodeSeries> PerPort(const HostSample& h, F value) {
  std::vector<NodeSeries> out;
  out.reserve(h.nic_ports_size());
  for (const NicPort& p : h.nic_ports()) {
    if (const std::optional<double> v = value(p)) out.push_back({{p.device()}, *v});
  }
  return out;
}

// One series per port labelled `device`; `value` is nullopt when the port lacks the reading.
HostMetric Port(const char* name, MetricType type, const char* help, const char* unit,
                std::vector<NodeSeries> (*series)(const HostSample&),
                Scope scope = Scope::kAgentAndCollector) {
  return HostMetric{
      name, type, help, unit, {"device"}, nullptr, series, nullptr, Importance::kNormal, scope};
}

std::optional<double> IfSet(bool has, uint64_t v) {
  if (!has) return std::nullopt;
  return static_cast<double>(v);
}

// The four error counters of the IB PortCounters, by their sysfs file names.
std::vector<NodeSeries> ErrorSeries(const HostSample& h) {
  std::vector<NodeSeries> out;
  for (const NicPort& p : h.nic_ports()) {
    const std::pair<const char*, std::optional<double>> counters[] = {
        {"symbol_error", IfSet(p.has_symbol_errors_total(), p.symbol_errors_total())},
        {"port_rcv_errors", IfSet(p.has_receive_errors_total(), p.receive_errors_total())},
        {"link_downed", IfSet(p.has_link_downed_total(), p.link_downed_total())},
        {"port_xmit_discards", IfSet(p.has_transmit_discards_total(), p.transmit_discards_total())},
    };
    for (const auto& [counter, value] : counters) {
      if (value) out.push_back({{p.device(), counter}, *value});
    }
  }
  return out;
}

// The ports read and left out, and each port's link layer.
void AppendNicInventory(std::vector<HostMetric>* table) {
  std::vector<HostMetric>& t = *table;
  t.push_back(HostMetric{"nic_ports",
                         MetricType::Gauge,
                         "InfiniBand and RoCE ports read from /sys/class/infiniband (at most "
                         "64); absent on a host without any.",
                         "",
                         {},
                         [](const HostSample& h) -> std::optional<double> {
                           if (h.nic_ports_size() == 0 && h.nic_ports_omitted() == 0) {
                             return std::nullopt;
                           }
                           return h.nic_ports_size() + 0.0;
                         },
                         nullptr,
                         nullptr,
                         Importance::kNormal,
                         Scope::kAgentAndCollector});
  t.push_back(HostMetric{"nic_ports_omitted",
                         MetricType::Gauge,
                         "InfiniBand and RoCE ports beyond the bound of 64, not read.",
                         "",
                         {},
                         [](const HostSample& h) -> std::optional<double> {
                           if (h.nic_ports_size() == 0 && h.nic_ports_omitted() == 0) {
                             return std::nullopt;
                           }
                           return h.nic_ports_omitted() + 0.0;
                         },
                         nullptr,
                         nullptr,
                         Importance::kNormal,
                         Scope::kAgentOnly});
  t.push_back(HostMetric{"nic_port_info",
                         MetricType::Gauge,
                         "InfiniBand or RoCE port; link_layer is InfiniBand or Ethernet (RoCE). "
                         "Always 1.",
                         "",
                         {"device", "link_layer"},
                         nullptr,
                         [](const HostSample& h) {
                           std::vector<NodeSeries> out;
                           for (const NicPort& p : h.nic_ports()) {
                             out.push_back({{p.device(), p.link_layer()}, 1});
                           }
                           return out;
                         },
                         nullptr,
                         Importance::kNormal,
                         Scope::kAgentAndCollector});
}

// Each port's states and link.
void AppendNicPortStates(std::vector<HostMetric>* table) {
  std::vector<HostMetric>& t = *table;
  t.push_back(
      Port("nic_port_up", MetricType::Gauge,
           "1 when the port is ACTIVE (or ACTIVE_DEFER) and its physical link is LinkUp, else 0.",
           "", [](const HostSample& h) {
             return PerPort(h, [](const NicPort& p) -> std::optional<double> {
               if (!p.has_state()) return std::nullopt;
               const bool link_up =
                   !p.has_physical_state() || p.physical_state() == kIbPhysicalStateLinkUp;
               return (p.state() == kIbPortStateActive || p.state() == kIbPortStateActiveDefer) &&
                              link_up
                          ? 1.0
                          : 0.0;
             });
           }));
  t.push_back(Port("nic_port_state", MetricType::Gauge,
                   "Logical port state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.", "",
                   [](const HostSample& h) {
                     return PerPort(
                         h, [](const NicPort& p) { return IfSet(p.has_state(), p.state()); });
                   }));
  t.push_back(Port("nic_port_physical_state", MetricType::Gauge,
                   "Physical port state: 1 Sleep, 2 Polling, 3 Disabled, 4 "
                   "PortConfigurationTraining, 5 LinkUp, 6 LinkErrorRecovery, 7 PhyTest.",
                   "", [](const HostSample& h) {
                     return PerPort(h, [](const NicPort& p) {
                       return IfSet(p.has_physical_state(), p.physical_state());
                     });
                   }));
  t.push_back(Port("nic_port_rate_bytes_per_second", MetricType::Gauge,
                   "Signalling rate of the link (sysfs rate, e.g. 200 Gb/sec is 2.5e10).",
                   "bytes_per_second", [](const HostSample& h) {
                     return PerPort(h, [](const NicPort& p) -> std::optional<double> {
                       if (!p.has_rate_bytes_per_second()) return std::nullopt;
                       return p.rate_bytes_per_second();
                     });
                   }));
  t.push_back(Port("nic_port_link_width", MetricType::Gauge, "Lanes of the link (4 for 4X).", "",
                   [](const HostSample& h) {
                     return PerPort(h, [](const NicPort& p) {
                       return IfSet(p.has_link_width(), p.link_width());
                     });
                   }));
}

// Each port's error and traffic counters.
void AppendNicPortCounters(std::vector<HostMetric>* table) {
  std::vector<HostMetric>& t = *table;
  t.push_back(HostMetric{"nic_port_errors_total",
                         MetricType::Counter,
                         "Port error counters, by sysfs counter name: symbol_error, "
                         "port_rcv_errors, link_downed, port_xmit_discards.",
                         "",
                         {"device", "counter"},
                         nullptr,
                         ErrorSeries,
                         nullptr,
                         Importance::kNormal,
                         Scope::kAgentAndCollector});
  t.push_back(Port("nic_port_received_bytes_total", MetricType::Counter,
                   "Data received on the port (port_rcv_data, converted from 4-byte words).",
                   "bytes", [](const HostSample& h) {
                     return PerPort(h, [](const NicPort& p) {
                       return IfSet(p.has_received_bytes_total(), p.received_bytes_total());
                     });
                   }));
  t.push_back(Port("nic_port_transmitted_bytes_total", MetricType::Counter,
                   "Data sent on the port (port_xmit_data, converted from 4-byte words).", "bytes",
                   [](const HostSample& h) {
                     return PerPort(h, [](const NicPort& p) {
                       return IfSet(p.has_transmitted_bytes_total(), p.transmitted_bytes_total());
                     });
                   }));
  t.push_back(Port(
      "nic_port_transmit_wait_total", MetricType::Counter,
      "Ticks in which the port had data to send but no flow-control credit (port_xmit_wait).", "",
      [](const HostSample& h) {
        return PerPort(h, [](const NicPort& p) {
          return IfSet(p.has_transmit_wait_total(), p.transmit_wait_total());
        });
      },
      Scope::kAgentOnly));
}

// The driver's own counters and the readings that failed.
void AppendNicDriverReadings(std::vector<HostMetric>* table) {
  std::vector<HostMetric>& t = *table;
  t.push_back(HostMetric{"nic_port_hw_counters_total",
                         MetricType::Counter,
                         "Driver counters of the port (hw_counters), by name; at most 64.",
                         "",
                         {"device", "counter"},
                         nullptr,
                         [](const HostSample& h) {
                           std::vector<NodeSeries> out;
                           for (const NicPort& p : h.nic_ports()) {
                             // A protobuf map has no order: sorted, for a stable exposition.
                             std::map<std::string, uint64_t> sorted(p.hw_counters().begin(),
                                                                    p.hw_counters().end());
                             for (const auto& [name, value] : sorted) {
                               out.push_back({{p.device(), name}, static_cast<double>(value)});
                             }
                           }
                           return out;
                         },
                         nullptr,
                         Importance::kNormal,
                         Scope::kAgentOnly});
  t.push_back(HostMetric{"nic_port_reading_unavailable",
                         MetricType::Gauge,
                         "1 for each reading of the port that could not be read or parsed, by "
                         "sysfs file name (state, rate, symbol_error, hw_counters, ...).",
                         "",
                         {"device", "reading"},
                         nullptr,
                         [](const HostSample& h) {
                           std::vector<NodeSeries> out;
                           for (const NicPort& p : h.nic_ports()) {
                             for (const std::string& reading : p.unavailable()) {
                               out.push_back({{p.device(), reading}, 1});
                             }
                           }
                           return out;
                         },
                         nullptr,
                         Importance::kNormal,
                         Scope::kAgentOnly});
}

}  // namespace

void AppendNicMetrics(std::vector<HostMetric>* table) {
  AppendNicInventory(table);
  AppendNicPortStates(table);
  AppendNicPortCounters(table);
  AppendNicDriverReadings(table);
}

}  // namespace stepwatch::metrics
