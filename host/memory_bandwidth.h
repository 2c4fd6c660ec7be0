// Host memory traffic counters: resctrl memory-bandwidth monitoring (mbm_total_bytes) or perf
// uncore memory-controller (IMC) CAS counters, whichever the kernel exposes and permits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stepwatch::host {

struct MemoryTraffic {
  // Bytes moved since an arbitrary origin.
  uint64_t bytes = 0;
  // Identifies the set of counters summed; a rate is only meaningful between readings with the
  // same layout (resctrl groups come and go).
  std::string layout;
};

class MemoryTrafficCounter {
 public:
  virtual ~MemoryTrafficCounter() = default;
  // "resctrl" or "perf".
  virtual const char* source() const = 0;
  virtual absl::StatusOr<MemoryTraffic> Read() = 0;
};

// Sums mbm_total_bytes over every monitoring domain of the default group and of each control
// group under <root>/sys/fs/resctrl. Error when none is readable.
absl::StatusOr<std::unique_ptr<MemoryTrafficCounter>> OpenResctrlCounter(const std::string& root);

// One CAS counter of one uncore IMC PMU, described by sysfs.
struct ImcEvent {
  std::string pmu;   // e.g. "uncore_imc_0"
  std::string name;  // "cas_count_read" or "cas_count_write"
  uint32_t type = 0;
  uint64_t config = 0;
  int cpu = 0;
  double bytes_per_count = 0;  // scale * unit, 64 bytes per CAS on Intel
};

// Reads <root>/sys/bus/event_source/devices/uncore_imc_*; error when there are none.
absl::StatusOr<std::vector<ImcEvent>> DiscoverImcEvents(const std::string& root);

// Opens the IMC events with perf_event_open (system-wide, one CPU per PMU). Needs
// CAP_PERFMON or perf_event_paranoid <= 0. Only for the real root: perf is a kernel interface that
// a fake tree cannot redirect.
absl::StatusOr<std::unique_ptr<MemoryTrafficCounter>> OpenPerfImcCounter(const std::string& root);

// resctrl first, then perf (real root only); nullptr with `*why` set when neither works.
std::unique_ptr<MemoryTrafficCounter> OpenMemoryTrafficCounter(const std::string& root,
                                                               std::string* why);

}  // namespace stepwatch::host
