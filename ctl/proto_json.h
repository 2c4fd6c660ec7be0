// --json of every stepwatchctl command: proto3 JSON with the .proto field names and default values
// printed, and 64-bit integers as numbers (proto3 JSON quotes them), as report --json prints them.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace stepwatch::ctl {

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message);

}  // namespace stepwatch::ctl
