#include "sim/driver.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file.h"
#include "common/json.h"
#include "common/log.h"
#include "common/step_event_rules.h"

namespace stepwatch::sim {
namespace {

void AppendField(std::string* out, const char* name, double value) {
  absl::StrAppend(out, ",\"", name, "\":", absl::StrFormat("%.9g", value));
}
void AppendField(std::string* out, const char* name, int64_t value) {
  absl::StrAppend(out, ",\"", name, "\":", value);
}

}  // namespace

std::string EncodeStepEvent(const analysis::StepEvent& s) {
  // The datagram's own keys (step_s, not step_seconds), from the rules.
  auto key = [](step_event::FieldId id) { return step_event::kFieldRules[id].name; };
  std::string out = absl::StrCat("{\"", key(step_event::kJob), "\":");
  json::AppendQuoted(s.job, &out);
  AppendField(&out, key(step_event::kRank), int64_t{s.rank});
  AppendField(&out, key(step_event::kWorldSize), int64_t{s.world_size});
  AppendField(&out, key(step_event::kStep), s.step);
  AppendField(&out, key(step_event::kStepS), s.step_seconds);
  if (s.data_seconds) AppendField(&out, key(step_event::kDataS), *s.data_seconds);
  if (s.compute_seconds) AppendField(&out, key(step_event::kComputeS), *s.compute_seconds);
  if (s.comm_seconds) AppendField(&out, key(step_event::kCommS), *s.comm_seconds);
  if (s.samples) AppendField(&out, key(step_event::kSamples), *s.samples);
  if (s.local_rank) AppendField(&out, key(step_event::kLocalRank), int64_t{*s.local_rank});
  if (s.gpu) AppendField(&out, key(step_event::kGpu), int64_t{*s.gpu});
  if (s.dp_rank) AppendField(&out, key(step_event::kDpRank), int64_t{*s.dp_rank});
  if (s.pp_stage) AppendField(&out, key(step_event::kPpStage), int64_t{*s.pp_stage});
  if (s.tp_rank) AppendField(&out, key(step_event::kTpRank), int64_t{*s.tp_rank});
  if (!s.sections.empty()) {
    absl::StrAppend(&out, ",\"", key(step_event::kSections), "\":{");
    for (size_t i = 0; i < s.sections.size(); ++i) {
      if (i > 0) out.push_back(',');
      json::AppendQuoted(s.sections[i].first, &out);
      absl::StrAppend(&out, ":", absl::StrFormat("%.9g", s.sections[i].second));
    }
    out.push_back('}');
  }
  out.push_back('}');
  return out;
}

std::string EncodeFakeNvmlState(const std::vector<analysis::GpuSample>& gpus) {
  std::string out = "{\"driver_version\":\"sim\",\"gpus\":[";
  for (size_t i = 0; i < gpus.size(); ++i) {
    const analysis::GpuSample& g = gpus[i];
    if (i > 0) out.push_back(',');
    absl::StrAppend(&out, "{\"name\":\"Simulated GPU\",\"uuid\":\"GPU-sim-", g.node, "-", g.index,
                    "\"");
    if (g.utilization_ratio) {
      AppendField(&out, "utilization_gpu",
                  static_cast<int64_t>(std::llround(*g.utilization_ratio * 100)));
      AppendField(&out, "utilization_memory",
                  static_cast<int64_t>(std::llround(*g.utilization_ratio * 40)));
    }
    AppendField(&out, "memory_used_bytes", int64_t{40} << 30);
    AppendField(&out, "memory_total_bytes", int64_t{80} << 30);
    if (g.sm_clock_mhz) AppendField(&out, "sm_clock_mhz", static_cast<int64_t>(*g.sm_clock_mhz));
    if (g.sm_clock_max_mhz) {
      AppendField(&out, "sm_clock_max_mhz", static_cast<int64_t>(*g.sm_clock_max_mhz));
    }
    if (g.power_watts) AppendField(&out, "power_mw", static_cast<int64_t>(*g.power_watts * 1000));
    if (g.power_limit_watts) {
      AppendField(&out, "power_limit_mw", static_cast<int64_t>(*g.power_limit_watts * 1000));
    }
    if (g.temperature_celsius) {
      AppendField(&out, "temperature_c", static_cast<int64_t>(*g.temperature_celsius));
    }
    if (g.throttle_reasons) {
      AppendField(&out, "throttle_reasons", static_cast<int64_t>(*g.throttle_reasons));
    }
    if (g.sm_activity_ratio) AppendField(&out, "sm_activity", *g.sm_activity_ratio);
    if (g.dram_bandwidth_ratio) AppendField(&out, "dram_bandwidth", *g.dram_bandwidth_ratio);
    if (g.tensor_activity_ratio) AppendField(&out, "tensor_activity", *g.tensor_activity_ratio);
    out.append(",\"pids\":[");
    for (size_t p = 0; p < g.pids.size(); ++p) {
      if (p > 0) out.push_back(',');
      absl::StrAppend(&out, g.pids[p]);
    }
    out.append("]}");
  }
  out.append("]}");
  return out;
}

Driver::Driver(Scenario scenario, DriverOptions options)
    : scenario_(std::move(scenario)), options_(std::move(options)) {
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
}

Driver::~Driver() {
  if (fd_ >= 0) ::close(fd_);
}

std::string Driver::SocketFor(const std::string& node) const {
  auto it = options_.sockets.find(node);
  if (it != options_.sockets.end()) return it->second;
  return absl::StrCat(options_.socket_dir, "/", node, ".sock");
}

void Driver::Send(const std::string& node, const std::string& payload) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string path = SocketFor(node);
  if (path.size() >= sizeof(addr.sun_path)) {
    ++stats_.events_dropped;
    return;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ssize_t n = ::sendto(fd_, payload.data(), payload.size(), MSG_DONTWAIT,
                       reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  if (n < 0) {
    ++stats_.events_dropped;
  } else {
    ++stats_.events_sent;
  }
}

absl::Status Driver::WriteGpuState(const Tick& tick) {
  for (const analysis::GpuSample& g : tick.gpus) gpu_state_[g.node][g.index] = g;
  for (const auto& [node, by_index] : gpu_state_) {
    std::vector<analysis::GpuSample> gpus;
    for (const auto& [index, reading] : by_index) gpus.push_back(reading);
    std::string path = absl::StrCat(options_.nvml_state_dir, "/", node, "-nvml.json");
    if (absl::Status s = WriteFileAtomically(path, EncodeFakeNvmlState(gpus)); !s.ok()) return s;
    ++stats_.gpu_state_writes;
  }
  return absl::OkStatus();
}

absl::Status Driver::Run() {
  if (fd_ < 0) {
    return absl::InternalError(absl::StrCat("socket(AF_UNIX): ", std::strerror(errno)));
  }
  if (options_.speed <= 0) return absl::InvalidArgumentError("speed must be > 0");
  Generator generator(scenario_);
  const auto wall_start = std::chrono::steady_clock::now();
  int64_t sim_start = -1;
  Tick tick;
  while (!stop_.load() && generator.Next(&tick)) {
    if (sim_start < 0) sim_start = tick.unix_nanos;
    // Pace: the step ends at its simulated time, scaled by speed. Sleep in short slices so that
    // Stop() takes effect promptly even during a long simulated hang.
    const auto due =
        wall_start + std::chrono::nanoseconds(static_cast<int64_t>(
                         static_cast<double>(tick.unix_nanos - sim_start) / options_.speed));
    while (!stop_.load() && std::chrono::steady_clock::now() < due) {
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          due - std::chrono::steady_clock::now(), std::chrono::milliseconds(100)));
    }
    if (stop_.load()) break;
    for (const analysis::StepEvent& sample : tick.samples) {
      Send(sample.node, EncodeStepEvent(sample));
    }
    if (!tick.gpus.empty() && !options_.nvml_state_dir.empty()) {
      if (absl::Status s = WriteGpuState(tick); !s.ok()) return s;
    }
    ++stats_.steps;
    if (options_.max_steps > 0 && stats_.steps >= options_.max_steps) break;
  }
  return absl::OkStatus();
}

}  // namespace stepwatch::sim
