#include "host/host_sampler.h"

#include <chrono>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/file.h"
#include "common/log.h"
#include "host/memory_bandwidth.h"
#include "host/nic_ports.h"
#include "host/proc_parse.h"

namespace stepwatch::host {
namespace {

class ProcHostSampler : public HostSampler {
 public:
  ProcHostSampler(const HostSamplerOptions& options,
                  std::unique_ptr<MemoryTrafficCounter> memory_traffic)
      : root_(options.root), memory_traffic_(std::move(memory_traffic)), nic_ports_(options.root) {}

  absl::StatusOr<v1::HostSample> Sample(int64_t now_unix_nanos) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    v1::HostSample sample;
    sample.set_sampled_unix_nanos(now_unix_nanos);

    // Without /proc/stat there is no host reading worth shipping.
    absl::StatusOr<std::string> stat_text = ReadFile(root_ + "/proc/stat");
    if (!stat_text.ok()) return stat_text.status();
    absl::StatusOr<CpuTimes> cpu = ParseProcStat(*stat_text);
    if (!cpu.ok()) {
      return absl::Status(cpu.status().code(),
                          absl::StrCat(root_, "/proc/stat: ", cpu.status().message()));
    }
    sample.set_cpu_count(cpu->cpu_count);
    if (prev_cpu_.has_value()) {
      std::optional<double> util = CpuUtilization(*prev_cpu_, *cpu);
      if (util.has_value()) sample.set_cpu_utilization_ratio(*util);
    }
    prev_cpu_ = *cpu;

    absl::StatusOr<MemInfo> mem = Parse(root_ + "/proc/meminfo", ParseMeminfo);
    if (mem.ok()) {
      sample.set_memory_total_bytes(mem->total_bytes);
      if (mem->available_bytes.has_value()) {
        sample.set_memory_available_bytes(*mem->available_bytes);
      }
    }
    absl::StatusOr<NetTotals> net = Parse(root_ + "/proc/net/dev", ParseNetDev);
    if (net.ok()) {
      sample.set_network_receive_bytes_total(net->receive_bytes);
      sample.set_network_transmit_bytes_total(net->transmit_bytes);
    }
    SampleMemoryBandwidth(now_unix_nanos, &sample);
    nic_ports_.Read(&sample);
    return sample;
  }

 private:
  template <typename T>
  absl::StatusOr<T> Parse(const std::string& path, absl::StatusOr<T> (*parse)(absl::string_view)) {
    absl::StatusOr<std::string> text = ReadFile(path);
    if (!text.ok()) {
      Warn(text.status());
      return text.status();
    }
    absl::StatusOr<T> parsed = parse(*text);
    if (!parsed.ok()) {
      parsed =
          absl::Status(parsed.status().code(), absl::StrCat(path, ": ", parsed.status().message()));
      Warn(parsed.status());
    }
    return parsed;
  }

  void SampleMemoryBandwidth(int64_t now_unix_nanos, v1::HostSample* sample)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (memory_traffic_ == nullptr) return;
    sample->set_memory_bandwidth_source(memory_traffic_->source());
    absl::StatusOr<MemoryTraffic> traffic = memory_traffic_->Read();
    if (!traffic.ok()) {
      Warn(traffic.status());
      prev_traffic_.reset();
      return;
    }
    if (prev_traffic_.has_value() && prev_traffic_->layout == traffic->layout &&
        traffic->bytes >= prev_traffic_->bytes && now_unix_nanos > prev_traffic_time_) {
      const double seconds = (now_unix_nanos - prev_traffic_time_) / 1e9;
      sample->set_memory_bandwidth_bytes_per_second((traffic->bytes - prev_traffic_->bytes) /
                                                    seconds);
    }
    prev_traffic_ = std::move(*traffic);
    prev_traffic_time_ = now_unix_nanos;
  }

  void Warn(const absl::Status& status) {
    uint64_t suppressed = 0;
    if (log_limiter_.Allow(&suppressed)) {
      SW_LOG_WARNING << "host sample: " << status.message()
                     << (suppressed > 0 ? absl::StrCat(" (", suppressed, " similar suppressed)")
                                        : std::string());
    }
  }

  const std::string root_;
  absl::Mutex mu_;
  // Read() keeps state between calls: used under mu_ only.
  const std::unique_ptr<MemoryTrafficCounter> memory_traffic_ ABSL_PT_GUARDED_BY(mu_);
  std::optional<CpuTimes> prev_cpu_ ABSL_GUARDED_BY(mu_);
  std::optional<MemoryTraffic> prev_traffic_ ABSL_GUARDED_BY(mu_);
  int64_t prev_traffic_time_ ABSL_GUARDED_BY(mu_) = 0;
  NicPortReader nic_ports_ ABSL_GUARDED_BY(mu_);
  // Thread-safe on its own.
  LogRateLimiter log_limiter_{5, std::chrono::minutes(1)};
};

}  // namespace

std::unique_ptr<HostSampler> MakeHostSampler(const HostSamplerOptions& options) {
  std::string why;
  std::unique_ptr<MemoryTrafficCounter> traffic = OpenMemoryTrafficCounter(options.root, &why);
  if (traffic == nullptr) {
    SW_LOG_INFO << "host memory bandwidth unavailable (" << why << ")";
  } else {
    SW_LOG_INFO << "host memory bandwidth from " << traffic->source();
  }
  return std::make_unique<ProcHostSampler>(options, std::move(traffic));
}

}  // namespace stepwatch::host
