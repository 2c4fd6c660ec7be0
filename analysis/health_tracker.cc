#include "analysis/health_tracker.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "analysis/health.h"

namespace stepwatch::analysis {
namespace {

std::string Link(uint32_t gen, uint32_t width) { return absl::StrFormat("gen %u x%u", gen, width); }

int SeverityRank(Severity s) {
  switch (s) {
    case Severity::kCritical:
      return 0;
    case Severity::kWarning:
      return 1;
    case Severity::kInfo:
      return 2;
  }
  return 3;
}

// Appends a fault seen at `now` to `next`, keeping its start when it was already active in
// `before` (the same cause on the same device).
void AddFault(const std::vector<HealthFault>& before, int64_t now, Cause cause, Severity severity,
              std::string evidence, const std::string& device, std::vector<HealthFault>* next) {
  HealthFault f;
  f.cause = cause;
  f.severity = severity;
  f.since_unix_nanos = now;
  f.evidence = std::move(evidence);
  f.device = device;
  for (const HealthFault& b : before) {
    if (b.cause == f.cause && b.device == f.device) {
      f.since_unix_nanos = b.since_unix_nanos;
      break;
    }
  }
  next->push_back(std::move(f));
}

}  // namespace

void SortFaults(std::vector<HealthFault>* faults) {
  std::stable_sort(faults->begin(), faults->end(), [](const HealthFault& a, const HealthFault& b) {
    return std::make_tuple(SeverityRank(a.severity), static_cast<int>(a.cause), a.device) <
           std::make_tuple(SeverityRank(b.severity), static_cast<int>(b.cause), b.device);
  });
}

uint64_t RiseWindow::Add(int64_t nanos, uint64_t total, int64_t window) {
  auto at = [&](size_t i) -> Checkpoint& { return ring_[(first_ + i) % kCheckpoints]; };
  if (size_ > 0 && total < at(size_ - 1).total) size_ = 0;  // the driver reloaded: start afresh
  // Drop checkpoints older than the window, keeping the newest of them as the base.
  while (size_ >= 2 && nanos - at(1).nanos >= window) {
    first_ = (first_ + 1) % kCheckpoints;
    --size_;
  }
  const int64_t spacing = window / static_cast<int64_t>(kCheckpoints - 1);
  // The oldest checkpoint is the base and never follows the counter.
  if (size_ < 2 || nanos - at(size_ - 1).nanos >= spacing) {
    if (size_ == kCheckpoints) {
      first_ = (first_ + 1) % kCheckpoints;
      --size_;
    }
    at(size_) = {nanos, total};
    ++size_;
  } else {
    at(size_ - 1).total = total;  // the newest checkpoint follows the counter
  }
  return at(size_ - 1).total - at(0).total;
}

void GpuHealthTracker::Hold(Cause cause, Severity severity, std::string evidence, int64_t now,
                            std::vector<HealthFault>* next) const {
  AddFault(faults_, now, cause, severity, std::move(evidence), "", next);
}

void GpuHealthTracker::UpdateXids(const GpuHealth& h, int64_t now, int64_t window,
                                  std::vector<HealthFault>* next) {
  // Xid events: the agent counts them per code since it started. On the first reading a count
  // whose last event is within the window is new (the collector may have started after it).
  for (const XidCount& e : h.xids) {
    auto counted = xid_counted_.find(e.xid);
    const bool history = !seen_ && now - e.last_unix_nanos >= window;
    const uint64_t before = counted != xid_counted_.end() ? counted->second : history ? e.count : 0;
    if (e.count > before) {
      xid_last_nanos_[e.xid] = e.last_unix_nanos > 0 ? e.last_unix_nanos : now;
      xid_new_events_[e.xid] += e.count - before;
    }
    xid_counted_[e.xid] = e.count;
  }
  for (auto it = xid_last_nanos_.begin(); it != xid_last_nanos_.end();) {
    if (now - it->second >= window) {
      xid_new_events_.erase(it->first);
      it = xid_last_nanos_.erase(it);
      continue;
    }
    const XidClass c = ClassifyXid(it->first);
    const uint64_t events = xid_new_events_[it->first];
    const Severity severity =
        !c.hardware ? Severity::kInfo : (c.critical ? Severity::kCritical : Severity::kWarning);
    Hold(Cause::kXid, severity,
         absl::StrFormat("Xid %u (%s%s), %u event%s", it->first, c.meaning,
                         c.hardware ? "" : "; raised by the application, not a hardware fault",
                         events, events == 1 ? "" : "s"),
         now, next);
    ++it;
  }
}

void GpuHealthTracker::UpdateNvlinks(const GpuHealth& h, int64_t now, const EngineOptions& opt,
                                     std::vector<HealthFault>* next) {
  // NVLinks: a link that was up and is down now; errors summed over the links.
  uint64_t errors = 0;
  bool any_errors = false;
  std::string down;
  for (const NvLinkHealth& l : h.nvlinks) {
    if (l.link < 0 || static_cast<size_t>(l.link) >= link_was_up_.size()) continue;
    if (l.up) {
      link_was_up_[l.link] = true;
    } else if (link_was_up_[l.link]) {
      absl::StrAppend(&down, down.empty() ? "" : ", ", l.link);
    }
    if (l.errors_total) {
      errors += *l.errors_total;
      any_errors = true;
    }
  }
  if (!down.empty()) {
    Hold(Cause::kNvlinkDown, Severity::kCritical, absl::StrCat("NVLink ", down, " down"), now,
         next);
  }
  if (any_errors) {
    const int64_t window = absl::ToInt64Nanoseconds(opt.health_window);
    const uint64_t rise = nvlink_errors_.Add(now, errors, window);
    if (rise >= static_cast<uint64_t>(opt.nvlink_error_rise)) {
      Hold(Cause::kNvlinkErrors, Severity::kWarning,
           absl::StrFormat("%u NVLink errors in %.0f min", rise, window / 60e9), now, next);
    }
  }
}

void GpuHealthTracker::Update(const GpuSample& x, const EngineOptions& opt) {
  const GpuHealth& h = x.health;
  const int64_t now = x.sampled_unix_nanos;
  const int64_t window = absl::ToInt64Nanoseconds(opt.health_window);
  std::vector<HealthFault> next;

  UpdateXids(h, now, window, &next);

  if (h.ecc_uncorrected_total) {
    // Volatile counts restart with the driver; the first reading's count is history.
    if (!ecc_first_ || *h.ecc_uncorrected_total < *ecc_first_) ecc_first_ = h.ecc_uncorrected_total;
    if (*h.ecc_uncorrected_total > *ecc_first_) {
      Hold(Cause::kEccUncorrected, Severity::kCritical,
           absl::StrCat(*h.ecc_uncorrected_total - *ecc_first_,
                        " uncorrected ECC errors since the collector first saw the GPU"),
           now, &next);
    }
  }
  if (h.row_remap_failure.value_or(false)) {
    Hold(Cause::kRowRemapFailure, Severity::kCritical,
         "a row remap failed: the GPU needs replacing", now, &next);
  }
  if (h.row_remap_pending.value_or(false)) {
    Hold(Cause::kRowRemapPending, Severity::kWarning,
         "a row remap is pending until the GPU is reset", now, &next);
  }

  UpdateNvlinks(h, now, opt, &next);

  // PCIe: a link trained under its maximum means a fault only while the GPU is busy (idle GPUs
  // train down to save power).
  const std::optional<double> busy =
      x.sm_activity_ratio ? x.sm_activity_ratio : x.utilization_ratio;
  if (h.pcie_generation && h.pcie_generation_max && h.pcie_width && h.pcie_width_max && busy &&
      *busy >= opt.underutil_threshold &&
      (*h.pcie_generation < *h.pcie_generation_max || *h.pcie_width < *h.pcie_width_max)) {
    Hold(Cause::kPcieDowngraded, Severity::kWarning,
         absl::StrCat("PCIe ", Link(*h.pcie_generation, *h.pcie_width), " of ",
                      Link(*h.pcie_generation_max, *h.pcie_width_max), " while busy"),
         now, &next);
  } else if (!busy || *busy < opt.underutil_threshold) {
    // An idle reading neither shows nor clears a downgrade.
    for (const HealthFault& f : faults_) {
      if (f.cause == Cause::kPcieDowngraded) next.push_back(f);
    }
  }
  if (h.pcie_replays_total) {
    const uint64_t rise = replays_.Add(now, *h.pcie_replays_total, window);
    if (rise >= static_cast<uint64_t>(opt.pcie_replay_rise)) {
      Hold(Cause::kPcieReplays, Severity::kWarning,
           absl::StrFormat("%u PCIe replays in %.0f min", rise, window / 60e9), now, &next);
    }
  }
  seen_ = true;
  SortFaults(&next);
  faults_ = std::move(next);
}

void NicHealthTracker::Update(const HostSample& x, const EngineOptions& opt) {
  const int64_t now = x.sampled_unix_nanos;
  const int64_t window = absl::ToInt64Nanoseconds(opt.health_window);
  std::vector<HealthFault> next;
  auto hold = [&](const std::string& device, Cause cause, Severity severity, std::string evidence) {
    AddFault(faults_, now, cause, severity, std::move(evidence), device, &next);
  };
  // The best rate and width among the node's ports that are up: a port under them trained down
  // (a bad cable or transceiver), while ports of different kinds on one node are rare.
  double best_rate = 0;
  uint32_t best_width = 0;
  for (const NicPortHealth& p : x.nic_ports) {
    if (!p.Up()) continue;
    best_rate = std::max(best_rate, p.rate_bytes_per_second.value_or(0));
    best_width = std::max(best_width, p.link_width.value_or(0));
  }
  // Ports that left the reading are forgotten, so a node that renames its ports cannot grow this;
  // the map is rebuilt only when the set of ports changed (the usual reading has the same ports).
  bool same = true;
  for (const NicPortHealth& p : x.nic_ports) same = same && ports_.count(p.device) > 0;
  if (!same || ports_.size() != x.nic_ports.size()) {
    std::map<std::string, Port, std::less<>> kept;
    for (const NicPortHealth& p : x.nic_ports) {
      if (p.device.empty()) continue;
      auto old = ports_.find(p.device);
      kept[p.device] = old != ports_.end() ? old->second : Port();
    }
    ports_ = std::move(kept);
  }
  for (const NicPortHealth& p : x.nic_ports) {
    if (p.device.empty()) continue;
    Port& port = ports_.find(p.device)->second;
    if (p.Known()) {
      if (p.Up()) {
        port.was_up = true;
      } else if (port.was_up) {
        // A port never seen up (an unused one) is no fault.
        hold(p.device, Cause::kNicDown, Severity::kCritical,
             absl::StrCat("port ", p.device, " down (state ", p.state.value_or(0),
                          ", physical state ", p.physical_state.value_or(0), ")"));
      }
    }
    if (p.Up() && ((p.rate_bytes_per_second && *p.rate_bytes_per_second < best_rate) ||
                   (p.link_width && *p.link_width < best_width))) {
      hold(p.device, Cause::kNicDegraded, Severity::kWarning,
           absl::StrFormat("port %s at %.0f Gb/s x%u, the node's other ports at %.0f Gb/s x%u",
                           p.device, p.rate_bytes_per_second.value_or(0) * 8 / 1e9,
                           p.link_width.value_or(0), best_rate * 8 / 1e9, best_width));
    }
    const uint64_t errors = p.errors_total ? port.errors.Add(now, *p.errors_total, window) : 0;
    const uint64_t downed =
        p.link_downed_total ? port.downed.Add(now, *p.link_downed_total, window) : 0;
    if (errors >= static_cast<uint64_t>(opt.nic_error_rise) || downed > 0) {
      hold(
          p.device, Cause::kNicErrors, Severity::kWarning,
          absl::StrFormat("port %s: %u symbol and receive errors, link downed %u times in %.0f min",
                          p.device, errors, downed, window / 60e9));
    }
  }
  SortFaults(&next);
  faults_ = std::move(next);
}

}  // namespace stepwatch::analysis
