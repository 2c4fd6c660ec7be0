// The collector's state file (scaling history), written atomically so that a crash mid-write
// leaves the previous version intact.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stepwatch::collector {

// Writes `data` to `path` via a temporary file in the same directory, fsync and rename.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view data);

// The whole file; NotFound when it does not exist.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace stepwatch::collector
