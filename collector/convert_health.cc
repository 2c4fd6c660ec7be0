#include "collector/convert_health.h"

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <utility>

namespace stepwatch::collector {
namespace {

// The sum of the counters present; absent when none is.
std::optional<uint64_t> SumPresent(std::initializer_list<std::pair<bool, uint64_t>> parts) {
  std::optional<uint64_t> sum;
  for (const auto& [present, value] : parts) {
    if (present) sum = sum.value_or(0) + value;
  }
  return sum;
}

}  // namespace

analysis::GpuHealth ToGpuHealth(const v1::GpuHealth& h) {
  analysis::GpuHealth r;
  if (h.has_pcie_link_generation_current()) r.pcie_generation = h.pcie_link_generation_current();
  if (h.has_pcie_link_generation_max()) r.pcie_generation_max = h.pcie_link_generation_max();
  if (h.has_pcie_link_width_current()) r.pcie_width = h.pcie_link_width_current();
  if (h.has_pcie_link_width_max()) r.pcie_width_max = h.pcie_link_width_max();
  if (h.has_pcie_replays_total()) r.pcie_replays_total = h.pcie_replays_total();
  if (h.has_ecc()) r.ecc_uncorrected_total = h.ecc().uncorrected_volatile();
  if (h.has_remapped_rows()) {
    r.row_remap_pending = h.remapped_rows().pending();
    r.row_remap_failure = h.remapped_rows().failure();
  }
  r.nvlinks.reserve(static_cast<size_t>(h.nvlinks_size()));
  for (const v1::GpuHealth::NvLink& l : h.nvlinks()) {
    analysis::NvLinkHealth link;
    link.link = static_cast<int>(l.link());
    link.up = l.up();
    link.errors_total = SumPresent({{l.has_replay_errors_total(), l.replay_errors_total()},
                                    {l.has_recovery_errors_total(), l.recovery_errors_total()},
                                    {l.has_crc_flit_errors_total(), l.crc_flit_errors_total()},
                                    {l.has_crc_data_errors_total(), l.crc_data_errors_total()}});
    if (l.has_recovery_errors_total()) link.recovery_errors_total = l.recovery_errors_total();
    r.nvlinks.push_back(link);
  }
  r.xids.reserve(static_cast<size_t>(h.xids_size()));
  for (const v1::GpuHealth::Xid& x : h.xids()) {
    r.xids.push_back({x.xid(), x.count(), x.last_unix_nanos()});
  }
  return r;
}

std::vector<analysis::NicPortHealth> ToNicPorts(const v1::HostSample& host) {
  std::vector<analysis::NicPortHealth> ports;
  ports.reserve(static_cast<size_t>(host.nic_ports_size()));
  for (const v1::NicPort& p : host.nic_ports()) {
    analysis::NicPortHealth r;
    r.device = p.device();
    if (p.has_state()) r.state = p.state();
    if (p.has_physical_state()) r.physical_state = p.physical_state();
    if (p.has_rate_bytes_per_second()) r.rate_bytes_per_second = p.rate_bytes_per_second();
    if (p.has_link_width()) r.link_width = p.link_width();
    r.errors_total = SumPresent({{p.has_symbol_errors_total(), p.symbol_errors_total()},
                                 {p.has_receive_errors_total(), p.receive_errors_total()}});
    if (p.has_link_downed_total()) r.link_downed_total = p.link_downed_total();
    ports.push_back(std::move(r));
  }
  return ports;
}

}  // namespace stepwatch::collector
