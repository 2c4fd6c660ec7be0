// Whole-file reads and crash-safe writes, shared by the collector's state file, the host sampler's
// /proc and /sys reads and the simulator's fake NVML state files.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stepwatch {

// The whole file, read to the end (/proc and /sys files report size 0), at most `max_bytes` of
// it so that a runaway file cannot exhaust memory. NotFound when it does not exist, Unavailable
// for other errors.
absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes = 64 << 20);

// Writes `data` to `path` via a temporary file in the same directory, fsync and rename, so that a
// crash mid-write leaves the previous version intact and readers never see a partial file.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view data);

}  // namespace stepwatch
