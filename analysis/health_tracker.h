// Hardware faults from health readings. A GPU's or a node's counters are totals kept by the driver
// since it loaded, so a tracker remembers what the first reading it saw said (history, not a
// fault) and keeps a few checkpoints over the last EngineOptions::health_window: a counter
// is a fault when it rose by its limit within the window, and stays one until the window holds
// no such rise. States (a link down, a remap pending) are faults as they are. Readings come
// roughly once per second per GPU; the checkpoints are coarse (a tenth of the window apart), so a
// tracker costs the same at 1 Hz as at 10 Hz.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "analysis/engine.h"
#include "analysis/health.h"

namespace stepwatch::analysis {

struct HealthFault {
  Cause cause = Cause::kUnknown;
  Severity severity = Severity::kWarning;
  int64_t since_unix_nanos = 0;
  std::string evidence;  // one line, e.g. "Xid 79 (GPU has fallen off the bus), 1 event"
  std::string device;    // a network port, "<device>:<port>"; empty for a GPU
};

// The most severe first, then in cause order: the first is the primary cause.
void SortFaults(std::vector<HealthFault>* faults);

// A counter's rise over a sliding window of coarse checkpoints.
class RiseWindow {
 public:
  // Records `total` at `nanos`; returns its rise over the checkpoints within `window` (a total
  // that fell, as after a driver reload, starts afresh).
  uint64_t Add(int64_t nanos, uint64_t total, int64_t window);

 private:
  static constexpr size_t kCheckpoints = 11;
  struct Checkpoint {
    int64_t nanos = 0;
    uint64_t total = 0;
  };
  std::array<Checkpoint, kCheckpoints> ring_{};
  size_t size_ = 0, first_ = 0;
};

class GpuHealthTracker {
 public:
  // Judges one reading (after the registry recorded it).
  void Update(const GpuSample& reading, const EngineOptions& opt);
  const std::vector<HealthFault>& faults() const { return faults_; }

 private:
  // Keeps the fault's start while it lasts.
  void Hold(Cause cause, Severity severity, std::string evidence, int64_t now,
            std::vector<HealthFault>* next) const;
  // The parts of Update: Xid events, and NVLinks (down links and the rise of their errors).
  void UpdateXids(const GpuHealth& h, int64_t now, int64_t window, std::vector<HealthFault>* next);
  void UpdateNvlinks(const GpuHealth& h, int64_t now, const EngineOptions& opt,
                     std::vector<HealthFault>* next);

  bool seen_ = false;
  std::optional<uint64_t> ecc_first_;
  std::map<uint32_t, uint64_t> xid_counted_;     // Xid code -> count at the last reading
  std::map<uint32_t, int64_t> xid_last_nanos_;   // Xid code -> when it last rose
  std::map<uint32_t, uint64_t> xid_new_events_;  // Xid code -> events within the window
  std::array<bool, 18> link_was_up_{};
  RiseWindow replays_, nvlink_errors_;
  std::vector<HealthFault> faults_;
};

class NicHealthTracker {
 public:
  void Update(const HostSample& reading, const EngineOptions& opt);
  const std::vector<HealthFault>& faults() const { return faults_; }

 private:
  struct Port {
    bool was_up = false;
    RiseWindow errors, downed;
  };
  // By device: the ports of the last reading (at most 64, the collector's limit per host).
  std::map<std::string, Port, std::less<>> ports_;
  std::vector<HealthFault> faults_;
};

}  // namespace stepwatch::analysis
