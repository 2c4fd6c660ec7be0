#include "gpu/gpm_sampler.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "gpu/gpu_source.h"

namespace stepwatch::gpu {
namespace {

constexpr const char* kGpmMetrics[] = {"sm_activity", "dram_bandwidth", "tensor_activity"};
constexpr unsigned int kGpmMetricIds[] = {nvml::kGpmMetricSmUtil, nvml::kGpmMetricDramBwUtil,
                                          nvml::kGpmMetricAnyTensorUtil};

}  // namespace

GpmSampler::~GpmSampler() {
  if (api_->gpm_sample_free == nullptr) return;
  for (Device& d : devices_) {
    if (d.prev != nullptr) api_->gpm_sample_free(d.prev);
    if (d.cur != nullptr) api_->gpm_sample_free(d.cur);
  }
}

std::string GpmSampler::ErrorString(nvml::Return rc) const {
  const char* text = api_->error_string != nullptr ? api_->error_string(rc) : nullptr;
  if (text == nullptr) return absl::StrCat("NVML error ", rc);
  return absl::StrCat(text, " (", rc, ")");
}

void GpmSampler::Unavailable(unsigned int index, UnavailableReadings* unavailable, v1::GpuSample* s,
                             const std::string& reason, const std::string& detail) const {
  for (const char* metric : kGpmMetrics) unavailable->Record(index, s, metric, reason, detail);
}

void GpmSampler::Probe(nvml::Device device, Device* d) {
  d->probed = true;
  nvml::GpmSupport support{};
  support.version = nvml::kGpmSupportVersion;
  nvml::Return rc = api_->gpm_query_device_support(device, &support);
  if (rc != nvml::kSuccess) {
    d->reason = UnavailableReason(rc);
    d->detail = absl::StrCat("nvmlGpmQueryDeviceSupport: ", ErrorString(rc));
  } else if (support.is_supported_device == 0) {
    d->reason = "not_supported";
    d->detail = "nvmlGpmQueryDeviceSupport: not a GPM device (before Hopper)";
  } else if ((rc = api_->gpm_sample_alloc(&d->prev)) != nvml::kSuccess ||
             (rc = api_->gpm_sample_alloc(&d->cur)) != nvml::kSuccess) {
    d->reason = UnavailableReason(rc);
    d->detail = absl::StrCat("nvmlGpmSampleAlloc: ", ErrorString(rc));
  }
}

void GpmSampler::Sample(unsigned int index, nvml::Device device, bool mig,
                        UnavailableReadings* unavailable, v1::GpuSample* s) {
  if (api_->gpm_query_device_support == nullptr || api_->gpm_sample_alloc == nullptr ||
      api_->gpm_sample_free == nullptr || api_->gpm_sample_get == nullptr ||
      api_->gpm_metrics_get == nullptr) {
    Unavailable(index, unavailable, s, "missing_entry_point",
                "the library does not export the nvmlGpm* entry points (drivers before R520)");
    return;
  }
  if (devices_.size() <= index) devices_.resize(index + 1);
  Device& d = devices_[index];
  if (mig) {
    d.has_prev = false;
    Unavailable(index, unavailable, s, "mig_enabled",
                "MIG mode is enabled; per-instance GPM is not collected");
    return;
  }
  if (!d.probed) Probe(device, &d);
  if (!d.reason.empty()) {
    Unavailable(index, unavailable, s, d.reason, d.detail);
    return;
  }
  // Measured right at the GPM call: the caller's timestamp may be taken well before it.
  const auto now = std::chrono::steady_clock::now();
  if (d.has_prev && now - d.prev_time < std::chrono::nanoseconds(kGpmMinIntervalNanos)) {
    if (!d.interval_logged) {
      d.interval_logged = true;
      SW_LOG_INFO << "NVML: GPU " << index << ": samples come less than "
                  << kGpmMinIntervalNanos / 1000000
                  << " ms apart; GPM is sampled at most that often and its last values repeat";
    }
    SetLast(d, s);
    return;
  }
  const nvml::Return rc = api_->gpm_sample_get(device, d.cur);
  if (rc != nvml::kSuccess) {
    d.has_prev = false;
    Unavailable(index, unavailable, s, UnavailableReason(rc),
                absl::StrCat("nvmlGpmSampleGet: ", ErrorString(rc)));
    return;
  }
  if (d.has_prev) Compute(index, &d, unavailable, s);
  std::swap(d.prev, d.cur);
  d.has_prev = true;
  d.prev_time = now;
}

void GpmSampler::Compute(unsigned int index, Device* d, UnavailableReadings* unavailable,
                         v1::GpuSample* s) {
  // 13 KiB: the whole struct as the largest NVML_GPM_METRIC_MAX declares it.
  auto get = std::make_unique<nvml::GpmMetricsGet>();
  get->version = nvml::kGpmMetricsGetVersion;
  get->num_metrics = 3;
  get->sample1 = d->prev;
  get->sample2 = d->cur;
  for (int i = 0; i < 3; ++i) get->metrics[i].metric_id = kGpmMetricIds[i];
  const nvml::Return rc = api_->gpm_metrics_get(get.get());
  for (int i = 0; i < 3; ++i) {
    d->last[i].reset();
    const nvml::Return metric_rc = rc != nvml::kSuccess ? rc : get->metrics[i].nvml_return;
    if (metric_rc == nvml::kSuccess) {
      d->last[i] = get->metrics[i].value / 100.0;  // GPM reports percentages.
    } else {
      unavailable->Record(index, s, kGpmMetrics[i], UnavailableReason(metric_rc),
                          absl::StrCat("nvmlGpmMetricsGet: ", ErrorString(metric_rc)));
    }
  }
  SetLast(*d, s);
}

void GpmSampler::SetLast(const Device& d, v1::GpuSample* s) {
  if (d.last[0]) s->set_sm_activity_ratio(*d.last[0]);
  if (d.last[1]) s->set_dram_bandwidth_ratio(*d.last[1]);
  if (d.last[2]) s->set_tensor_activity_ratio(*d.last[2]);
}

}  // namespace stepwatch::gpu
