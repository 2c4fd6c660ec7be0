// Decoding what NVML writes: which process-entry layout a driver uses, pids out of a process
// buffer, and field values by their declared type. Kept apart from the loader so that the layout
// rules are tested directly.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "gpu/nvml_abi.h"

namespace stepwatch::gpu {

// The largest process entry any driver writes (nvml::ProcessInfoV3Cc). Process buffers hold this
// many bytes per requested entry, so that no driver can write past them whatever its stride.
constexpr size_t kMaxProcessEntrySize = sizeof(nvml::ProcessInfoV3Cc);

// Bytes per entry that nvmlDeviceGetComputeRunningProcesses_v3 writes for a driver version string
// ("535.54.03"): 32 on 535.43 to 535.86.x, 24 on every other driver.
size_t ProcessEntrySizeOfV3(std::string_view driver_version);

// The pids of `count` entries of `entry_size` bytes at the start of `buffer` (the pid is the first
// field of every layout). Never reads past `buffer`.
std::vector<unsigned int> PidsFromProcessBuffer(const std::vector<unsigned char>& buffer,
                                                size_t entry_size, unsigned int count);

// A cumulative counter read from a field value: nullopt for an unknown type or a negative value.
std::optional<unsigned long long> FieldValueAsCounter(const nvml::FieldValue& v);

}  // namespace stepwatch::gpu
