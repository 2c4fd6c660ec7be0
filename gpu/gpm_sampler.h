// GPU performance monitoring (GPM, Hopper and later): SM activity, DRAM bandwidth and tensor
// activity, each computed by NVML between two GPM samples of a GPU. Keeps each GPU's two sample
// buffers and its last values between readings.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "gpu/nvml_abi.h"
#include "gpu/nvml_api.h"
#include "gpu/unavailable_readings.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::gpu {

class GpmSampler {
 public:
  // `api` must outlive the sampler; its gpm_* entry points may be missing (every GPM reading is
  // then unavailable, as missing_entry_point).
  explicit GpmSampler(const NvmlApi* api) : api_(api) {}
  // Frees every GPU's sample buffers.
  ~GpmSampler();
  GpmSampler(const GpmSampler&) = delete;
  GpmSampler& operator=(const GpmSampler&) = delete;

  // Sets GPU `index`'s GPM readings in `s`, or records in `unavailable` why they are missing.
  // The first reading of a GPU only takes a sample; readings less than kGpmMinIntervalNanos apart
  // repeat the last values.
  void Sample(unsigned int index, nvml::Device device, bool mig, UnavailableReadings* unavailable,
              v1::GpuSample* s);

 private:
  struct Device {
    bool probed = false;
    // Empty while GPM works; otherwise why not (an UnavailableReason value) and what said so.
    std::string reason;
    std::string detail;
    nvml::GpmSample prev = nullptr;
    nvml::GpmSample cur = nullptr;
    bool has_prev = false;
    // When the previous sample was taken, on this process's monotonic clock.
    std::chrono::steady_clock::time_point prev_time{};
    bool interval_logged = false;
    // The last values, repeated while samples come faster than kGpmMinIntervalNanos.
    std::optional<double> last[3];
  };

  void Probe(nvml::Device device, Device* d);
  void Unavailable(unsigned int index, UnavailableReadings* unavailable, v1::GpuSample* s,
                   const std::string& reason, const std::string& detail) const;
  // Computes the metrics between d->prev and d->cur into d->last.
  void Compute(unsigned int index, Device* d, UnavailableReadings* unavailable, v1::GpuSample* s);
  static void SetLast(const Device& d, v1::GpuSample* s);
  std::string ErrorString(nvml::Return rc) const;

  const NvmlApi* api_;
  std::vector<Device> devices_;
};

}  // namespace stepwatch::gpu
