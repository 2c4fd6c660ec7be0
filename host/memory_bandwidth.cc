#include "host/memory_bandwidth.h"

#include <linux/perf_event.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "host/proc_parse.h"

namespace stepwatch::host {
namespace {

namespace fs = std::filesystem;

// Sorted names of the entries of `dir`; empty when it cannot be listed.
std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class ResctrlCounter : public MemoryTrafficCounter {
 public:
  explicit ResctrlCounter(std::string resctrl_dir) : dir_(std::move(resctrl_dir)) {}

  const char* source() const override { return "resctrl"; }

  absl::StatusOr<MemoryTraffic> Read() override {
    // The default group's mon_data covers tasks outside every control group; each control group
    // has its own (which includes its monitoring groups), so the sum covers the whole host.
    std::vector<std::string> mon_dirs = {dir_ + "/mon_data"};
    for (const std::string& name : ListDir(dir_)) {
      if (name == "info" || name == "mon_data" || name == "mon_groups") continue;
      const std::string candidate = absl::StrCat(dir_, "/", name, "/mon_data");
      std::error_code ec;
      if (fs::is_directory(candidate, ec)) mon_dirs.push_back(candidate);
    }
    MemoryTraffic traffic;
    std::vector<std::string> files;
    for (const std::string& mon : mon_dirs) {
      for (const std::string& domain : ListDir(mon)) {
        const std::string path = absl::StrCat(mon, "/", domain, "/mbm_total_bytes");
        absl::StatusOr<std::string> text = ReadFile(path);
        if (!text.ok()) continue;
        absl::StatusOr<uint64_t> value = ParseResctrlCounter(*text);
        if (!value.ok()) continue;  // "Unavailable": the counter is not ready in this domain.
        traffic.bytes += *value;
        files.push_back(path);
      }
    }
    if (files.empty()) {
      return absl::UnavailableError(absl::StrCat("no readable mbm_total_bytes under ", dir_));
    }
    traffic.layout = absl::StrJoin(files, ";");
    return traffic;
  }

 private:
  const std::string dir_;
};

class PerfImcCounter : public MemoryTrafficCounter {
 public:
  struct Open {
    int fd;
    double bytes_per_count;
  };
  explicit PerfImcCounter(std::vector<Open> counters) : counters_(std::move(counters)) {}
  ~PerfImcCounter() override {
    for (const Open& c : counters_) close(c.fd);
  }

  const char* source() const override { return "perf"; }

  absl::StatusOr<MemoryTraffic> Read() override {
    double bytes = 0;
    for (const Open& c : counters_) {
      uint64_t count = 0;
      if (read(c.fd, &count, sizeof(count)) != static_cast<ssize_t>(sizeof(count))) {
        return absl::UnavailableError(absl::StrCat("reading perf IMC counter: ", strerror(errno)));
      }
      bytes += static_cast<double>(count) * c.bytes_per_count;
    }
    MemoryTraffic traffic;
    traffic.bytes = static_cast<uint64_t>(bytes);
    traffic.layout = "perf";
    return traffic;
  }

 private:
  std::vector<Open> counters_;
};

absl::StatusOr<std::string> ReadTrimmed(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return std::string(absl::StripAsciiWhitespace(*text));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryTrafficCounter>> OpenResctrlCounter(const std::string& root) {
  auto counter = std::make_unique<ResctrlCounter>(root + "/sys/fs/resctrl");
  absl::StatusOr<MemoryTraffic> first = counter->Read();
  if (!first.ok()) return first.status();
  return std::unique_ptr<MemoryTrafficCounter>(std::move(counter));
}

absl::StatusOr<std::vector<ImcEvent>> DiscoverImcEvents(const std::string& root) {
  const std::string devices = root + "/sys/bus/event_source/devices";
  std::vector<ImcEvent> events;
  std::string last_error;
  for (const std::string& pmu : ListDir(devices)) {
    if (!absl::StartsWith(pmu, "uncore_imc")) continue;
    const std::string dir = absl::StrCat(devices, "/", pmu);
    absl::StatusOr<std::string> type_text = ReadTrimmed(dir + "/type");
    uint32_t type = 0;
    if (!type_text.ok() || !absl::SimpleAtoi(*type_text, &type)) {
      last_error = absl::StrCat(pmu, ": unreadable type");
      continue;
    }
    int cpu = 0;
    if (absl::StatusOr<std::string> mask = ReadTrimmed(dir + "/cpumask"); mask.ok()) {
      absl::StatusOr<int> first = ParseFirstCpu(*mask);
      if (first.ok()) cpu = *first;
    }
    std::vector<std::pair<std::string, std::string>> formats;
    for (const std::string& term : ListDir(dir + "/format")) {
      absl::StatusOr<std::string> text = ReadTrimmed(absl::StrCat(dir, "/format/", term));
      if (text.ok()) formats.emplace_back(term, *text);
    }
    for (const char* name : {"cas_count_read", "cas_count_write"}) {
      const std::string base = absl::StrCat(dir, "/events/", name);
      absl::StatusOr<std::string> spec = ReadTrimmed(base);
      if (!spec.ok()) continue;
      absl::StatusOr<uint64_t> config = ParsePerfEventConfig(*spec, formats);
      if (!config.ok()) {
        last_error = absl::StrCat(pmu, "/", name, ": ", config.status().message());
        continue;
      }
      double scale = 1.0;
      if (absl::StatusOr<std::string> s = ReadTrimmed(base + ".scale"); s.ok()) {
        if (!absl::SimpleAtod(*s, &scale) || scale <= 0) {
          last_error = absl::StrCat(pmu, "/", name, ": bad scale '", *s, "'");
          continue;
        }
      }
      double unit_bytes = 1.0;
      if (absl::StatusOr<std::string> u = ReadTrimmed(base + ".unit"); u.ok()) {
        absl::StatusOr<double> b = ParsePerfUnitBytes(*u);
        if (!b.ok()) {
          last_error = absl::StrCat(pmu, "/", name, ": ", b.status().message());
          continue;
        }
        unit_bytes = *b;
      }
      events.push_back(ImcEvent{pmu, name, type, *config, cpu, scale * unit_bytes});
    }
  }
  if (events.empty()) {
    return absl::NotFoundError(
        last_error.empty() ? absl::StrCat("no uncore_imc PMU under ", devices) : last_error);
  }
  return events;
}

absl::StatusOr<std::unique_ptr<MemoryTrafficCounter>> OpenPerfImcCounter(const std::string& root) {
  absl::StatusOr<std::vector<ImcEvent>> events = DiscoverImcEvents(root);
  if (!events.ok()) return events.status();
  std::vector<PerfImcCounter::Open> open;
  for (const ImcEvent& e : *events) {
    perf_event_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.size = sizeof(attr);
    attr.type = e.type;
    attr.config = e.config;
    const long fd = syscall(SYS_perf_event_open, &attr, /*pid=*/-1, e.cpu, /*group_fd=*/-1,
                            PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
      // All or nothing: a subset of the memory controllers would under-report bandwidth.
      const std::string error =
          absl::StrCat("perf_event_open(", e.pmu, "/", e.name, "): ", strerror(errno));
      for (const PerfImcCounter::Open& o : open) close(o.fd);
      return absl::UnavailableError(error);
    }
    open.push_back(PerfImcCounter::Open{static_cast<int>(fd), e.bytes_per_count});
  }
  return std::unique_ptr<MemoryTrafficCounter>(std::make_unique<PerfImcCounter>(std::move(open)));
}

std::unique_ptr<MemoryTrafficCounter> OpenMemoryTrafficCounter(const std::string& root,
                                                               std::string* why) {
  absl::StatusOr<std::unique_ptr<MemoryTrafficCounter>> resctrl = OpenResctrlCounter(root);
  if (resctrl.ok()) return std::move(*resctrl);
  std::string reasons = absl::StrCat("resctrl: ", resctrl.status().message());
  if (root.empty() || root == "/") {
    absl::StatusOr<std::unique_ptr<MemoryTrafficCounter>> perf = OpenPerfImcCounter(root);
    if (perf.ok()) return std::move(*perf);
    absl::StrAppend(&reasons, "; perf: ", perf.status().message());
  }
  if (why != nullptr) *why = reasons;
  return nullptr;
}

}  // namespace stepwatch::host
