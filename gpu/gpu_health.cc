#include "gpu/gpu_health.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "gpu/nvml_symbols.h"

namespace stepwatch::gpu {
namespace {

// A link that NVML calls invalid or unsupported is not on this GPU (PCIe GPUs have none).
bool LinkAbsent(nvml::Return rc) {
  return rc == nvml::kErrorInvalidArgument || rc == nvml::kErrorNotSupported;
}

}  // namespace

GpuHealthReader::GpuHealthReader(void* nvml_handle, nvml::ErrorStringFn error_string)
    : error_string_(error_string) {
  void* h = nvml_handle;
  ResolveNvmlSymbol(h, &api_.curr_pcie_link_generation, {"nvmlDeviceGetCurrPcieLinkGeneration"});
  ResolveNvmlSymbol(h, &api_.max_pcie_link_generation, {"nvmlDeviceGetMaxPcieLinkGeneration"});
  ResolveNvmlSymbol(h, &api_.gpu_max_pcie_link_generation,
                    {"nvmlDeviceGetGpuMaxPcieLinkGeneration"});
  ResolveNvmlSymbol(h, &api_.curr_pcie_link_width, {"nvmlDeviceGetCurrPcieLinkWidth"});
  ResolveNvmlSymbol(h, &api_.max_pcie_link_width, {"nvmlDeviceGetMaxPcieLinkWidth"});
  ResolveNvmlSymbol(h, &api_.pcie_replay_counter, {"nvmlDeviceGetPcieReplayCounter"});
  ResolveNvmlSymbol(h, &api_.total_ecc_errors, {"nvmlDeviceGetTotalEccErrors"});
  ResolveNvmlSymbol(h, &api_.remapped_rows, {"nvmlDeviceGetRemappedRows"});
  ResolveNvmlSymbol(h, &api_.nvlink_state, {"nvmlDeviceGetNvLinkState"});
  ResolveNvmlSymbol(h, &api_.nvlink_error_counter, {"nvmlDeviceGetNvLinkErrorCounter"});
  ResolveNvmlSymbol(h, &api_.event_set_create, {"nvmlEventSetCreate"});
  ResolveNvmlSymbol(h, &api_.event_set_free, {"nvmlEventSetFree"});
  ResolveNvmlSymbol(h, &api_.register_events, {"nvmlDeviceRegisterEvents"});
  // Only _v2 writes the 32-byte nvmlEventData_t declared in nvml_abi.h.
  ResolveNvmlSymbol(h, &api_.event_set_wait, {"nvmlEventSetWait_v2"});
}

GpuHealthReader::~GpuHealthReader() {
  if (event_set_ != nullptr && api_.event_set_free != nullptr) api_.event_set_free(event_set_);
}

std::string GpuHealthReader::ErrorString(nvml::Return rc) const {
  const char* text = error_string_ != nullptr ? error_string_(rc) : nullptr;
  if (text == nullptr) return absl::StrCat("NVML error ", rc);
  return absl::StrCat(text, " (", rc, ")");
}

template <typename Fn, typename... Args>
bool GpuHealthReader::Call(Fn fn, const char* name, Failure* failure, Args... args) const {
  nvml::Return rc = nvml::kErrorFunctionNotFound;
  std::string detail;
  if (fn == nullptr) {
    detail = absl::StrCat("the library does not export ", name);
  } else {
    rc = fn(args...);
    if (rc == nvml::kSuccess) return true;
    detail = absl::StrCat(name, ": ", ErrorString(rc));
  }
  if (failure->rc == nvml::kSuccess) {
    failure->rc = rc;
    failure->detail = std::move(detail);
  }
  return false;
}

void GpuHealthReader::Report(unsigned int index, const char* reading, const Failure& failure,
                             UnavailableReadings* unavailable, v1::GpuSample* sample) {
  if (failure.rc == nvml::kSuccess) return;
  unavailable->Record(index, sample, reading, UnavailableReason(failure.rc), failure.detail);
}

void GpuHealthReader::Read(unsigned int index, nvml::Device device, int64_t now_unix_nanos,
                           UnavailableReadings* unavailable, v1::GpuSample* sample) {
  if (devices_.size() <= index) devices_.resize(index + 1);
  v1::GpuHealth health;
  ReadPcie(index, device, unavailable, sample, &health);
  ReadMemory(index, device, unavailable, sample, &health);
  ReadNvlinks(index, device, &devices_[index], unavailable, sample, &health);
  ReadXids(index, device, now_unix_nanos, &devices_[index], unavailable, sample, &health);
  if (health.ByteSizeLong() > 0) sample->mutable_health()->Swap(&health);
}

void GpuHealthReader::ReadPcie(unsigned int index, nvml::Device device,
                               UnavailableReadings* unavailable, v1::GpuSample* sample,
                               v1::GpuHealth* health) const {
  Failure link;
  unsigned int value = 0;
  if (Call(api_.curr_pcie_link_generation, "nvmlDeviceGetCurrPcieLinkGeneration", &link, device,
           &value)) {
    health->set_pcie_link_generation_current(value);
  }
  // The most the GPU and its slot allow together; the GPU's own maximum where that is missing.
  Failure max_generation;
  if (Call(api_.max_pcie_link_generation, "nvmlDeviceGetMaxPcieLinkGeneration", &max_generation,
           device, &value) ||
      Call(api_.gpu_max_pcie_link_generation, "nvmlDeviceGetGpuMaxPcieLinkGeneration",
           &max_generation, device, &value)) {
    health->set_pcie_link_generation_max(value);
  } else if (link.rc == nvml::kSuccess) {
    link = max_generation;
  }
  if (Call(api_.curr_pcie_link_width, "nvmlDeviceGetCurrPcieLinkWidth", &link, device, &value)) {
    health->set_pcie_link_width_current(value);
  }
  if (Call(api_.max_pcie_link_width, "nvmlDeviceGetMaxPcieLinkWidth", &link, device, &value)) {
    health->set_pcie_link_width_max(value);
  }
  Report(index, "pcie_link", link, unavailable, sample);

  Failure replays;
  if (Call(api_.pcie_replay_counter, "nvmlDeviceGetPcieReplayCounter", &replays, device, &value)) {
    health->set_pcie_replays_total(value);
  }
  Report(index, "pcie_replays", replays, unavailable, sample);
}

void GpuHealthReader::ReadMemory(unsigned int index, nvml::Device device,
                                 UnavailableReadings* unavailable, v1::GpuSample* sample,
                                 v1::GpuHealth* health) const {
  // All four or none: a detector compares volatile with aggregate counts.
  Failure ecc;
  unsigned long long counts[4] = {};
  const unsigned int kinds[4][2] = {{nvml::kMemoryErrorTypeCorrected, nvml::kVolatileEcc},
                                    {nvml::kMemoryErrorTypeUncorrected, nvml::kVolatileEcc},
                                    {nvml::kMemoryErrorTypeCorrected, nvml::kAggregateEcc},
                                    {nvml::kMemoryErrorTypeUncorrected, nvml::kAggregateEcc}};
  bool ecc_ok = true;
  for (int i = 0; i < 4 && ecc_ok; ++i) {
    ecc_ok = Call(api_.total_ecc_errors, "nvmlDeviceGetTotalEccErrors", &ecc, device, kinds[i][0],
                  kinds[i][1], &counts[i]);
  }
  if (ecc_ok) {
    v1::GpuHealth::Ecc* e = health->mutable_ecc();
    e->set_corrected_volatile(counts[0]);
    e->set_uncorrected_volatile(counts[1]);
    e->set_corrected_aggregate(counts[2]);
    e->set_uncorrected_aggregate(counts[3]);
  }
  Report(index, "ecc", ecc, unavailable, sample);

  Failure remap;
  unsigned int corrected = 0;
  unsigned int uncorrected = 0;
  unsigned int pending = 0;
  unsigned int failure = 0;
  if (Call(api_.remapped_rows, "nvmlDeviceGetRemappedRows", &remap, device, &corrected,
           &uncorrected, &pending, &failure)) {
    v1::GpuHealth::RemappedRows* r = health->mutable_remapped_rows();
    r->set_corrected(corrected);
    r->set_uncorrected(uncorrected);
    r->set_pending(pending != 0);
    r->set_failure(failure != 0);
  }
  Report(index, "remapped_rows", remap, unavailable, sample);
}

void GpuHealthReader::ReadNvlinks(unsigned int index, nvml::Device device, DeviceHealth* state,
                                  UnavailableReadings* unavailable, v1::GpuSample* sample,
                                  v1::GpuHealth* health) const {
  Failure link_state;
  if (api_.nvlink_state == nullptr) {
    link_state = {nvml::kErrorFunctionNotFound,
                  "the library does not export nvmlDeviceGetNvLinkState"};
    Report(index, "nvlink_state", link_state, unavailable, sample);
    Report(index, "nvlink_errors", link_state, unavailable, sample);
    return;
  }
  // Links 0..17 are probed once; later readings ask only for the links found.
  std::vector<unsigned int> probe;
  const bool probing = !state->nvlinks.has_value();
  if (probing) {
    for (unsigned int l = 0; l < nvml::kNvlinkMaxLinks; ++l) probe.push_back(l);
  }
  const std::vector<unsigned int>& links = probing ? probe : *state->nvlinks;
  std::vector<unsigned int> found;
  bool complete = true;
  Failure errors;
  bool any_counter = false;
  for (unsigned int link : links) {
    unsigned int active = nvml::kFeatureDisabled;
    const nvml::Return rc = api_.nvlink_state(device, link, &active);
    if (rc != nvml::kSuccess) {
      if (probing && LinkAbsent(rc)) continue;
      complete = false;
      if (link_state.rc == nvml::kSuccess) {
        link_state = {rc,
                      absl::StrCat("nvmlDeviceGetNvLinkState(link ", link, "): ", ErrorString(rc))};
      }
      continue;
    }
    found.push_back(link);
    v1::GpuHealth::NvLink* out = health->add_nvlinks();
    out->set_link(link);
    out->set_up(active == nvml::kFeatureEnabled);
    unsigned long long v = 0;
    const auto counter = [&](unsigned int which) {
      const bool read = Call(api_.nvlink_error_counter, "nvmlDeviceGetNvLinkErrorCounter", &errors,
                             device, link, which, &v);
      any_counter = any_counter || read;
      return read;
    };
    if (counter(nvml::kNvlinkErrorDlReplay)) out->set_replay_errors_total(v);
    if (counter(nvml::kNvlinkErrorDlRecovery)) out->set_recovery_errors_total(v);
    if (counter(nvml::kNvlinkErrorDlCrcFlit)) out->set_crc_flit_errors_total(v);
    if (counter(nvml::kNvlinkErrorDlCrcData)) out->set_crc_data_errors_total(v);
  }
  if (probing && complete) state->nvlinks = found;
  if (link_state.rc == nvml::kSuccess && found.empty() && complete) {
    link_state = {nvml::kErrorNotSupported, "nvmlDeviceGetNvLinkState: the GPU has no NVLink"};
  }
  Report(index, "nvlink_state", link_state, unavailable, sample);
  // Without a link, the error counters are unavailable for the same reason as the links. Some
  // drivers lack some counters (CRC data on newer links): those are left unset, and the reading
  // is unavailable only when no counter could be read.
  if (found.empty()) {
    Report(index, "nvlink_errors", link_state, unavailable, sample);
  } else if (!any_counter) {
    Report(index, "nvlink_errors", errors, unavailable, sample);
  }
}

bool GpuHealthReader::DrainEvents(int64_t now_unix_nanos, Failure* failure) {
  for (int i = 0; i < kMaxXidEventsPerRead; ++i) {
    nvml::EventData event{};
    // Timeout 0: return at once when nothing is pending; the sampler must not wait here.
    const nvml::Return rc = api_.event_set_wait(event_set_, &event, 0);
    if (rc == nvml::kErrorTimeout) return true;
    if (rc != nvml::kSuccess) {
      *failure = {rc, absl::StrCat("nvmlEventSetWait_v2: ", ErrorString(rc))};
      return false;
    }
    if ((event.event_type & nvml::kEventTypeXidCriticalError) == 0) continue;
    for (const auto& [handle, gpu] : registered_) {
      if (handle != event.device) continue;
      DeviceHealth& d = devices_[gpu];
      const bool known =
          event.event_data <= UINT_MAX && d.xids.count(static_cast<uint32_t>(event.event_data)) > 0;
      if (!known &&
          (event.event_data > UINT_MAX || static_cast<int>(d.xids.size()) >= kMaxXidCodesPerGpu)) {
        ++d.xid_events_dropped;
        break;
      }
      XidCount& x = d.xids[static_cast<uint32_t>(event.event_data)];
      ++x.count;
      x.last_unix_nanos = now_unix_nanos;
      break;
    }
  }
  return true;
}

void GpuHealthReader::ReadXids(unsigned int index, nvml::Device device, int64_t now_unix_nanos,
                               DeviceHealth* state, UnavailableReadings* unavailable,
                               v1::GpuSample* sample, v1::GpuHealth* health) {
  if (!event_set_tried_) {
    event_set_tried_ = true;
    if (api_.event_set_create == nullptr || api_.event_set_free == nullptr ||
        api_.register_events == nullptr || api_.event_set_wait == nullptr) {
      event_set_failure_ = {nvml::kErrorFunctionNotFound,
                            "the library does not export nvmlEventSetCreate, nvmlEventSetFree, "
                            "nvmlDeviceRegisterEvents and nvmlEventSetWait_v2"};
    } else {
      Call(api_.event_set_create, "nvmlEventSetCreate", &event_set_failure_, &event_set_);
    }
  }
  if (event_set_failure_.rc != nvml::kSuccess) {
    Report(index, "xid", event_set_failure_, unavailable, sample);
    return;
  }
  if (!state->xid_registered && state->xid_reason.empty()) {
    Failure reg;
    if (Call(api_.register_events, "nvmlDeviceRegisterEvents(nvmlEventTypeXidCriticalError)", &reg,
             device, nvml::kEventTypeXidCriticalError, event_set_)) {
      state->xid_registered = true;
      registered_.emplace_back(device, index);
    } else {
      // Not retried: a GPU that refuses Xid events keeps refusing them.
      state->xid_reason = UnavailableReason(reg.rc);
      state->xid_detail = reg.detail;
    }
  }
  if (!state->xid_registered) {
    unavailable->Record(index, sample, "xid", state->xid_reason, state->xid_detail);
    return;
  }
  Failure wait;
  if (!DrainEvents(now_unix_nanos, &wait)) Report(index, "xid", wait, unavailable, sample);
  for (const auto& [code, x] : state->xids) {
    v1::GpuHealth::Xid* out = health->add_xids();
    out->set_xid(code);
    out->set_count(x.count);
    out->set_last_unix_nanos(x.last_unix_nanos);
  }
  health->set_xid_events_dropped(state->xid_events_dropped);
}

}  // namespace stepwatch::gpu
