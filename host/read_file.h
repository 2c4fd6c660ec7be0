// Reads small kernel files (/proc and /sys report size 0, so read to the end).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace stepwatch::host {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path);

}  // namespace stepwatch::host
