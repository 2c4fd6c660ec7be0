// Validation of the step-event datagram (DESIGN.md, "Step event datagram, v1"): one JSON object in,
// one v1::StepEvent or a reason for rejecting it out.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::agent {

// Why a datagram was rejected. The names (RejectReasonName) are metric label values: never rename.
enum class RejectReason {
  kNotJson = 0,     // not valid UTF-8 JSON
  kNotObject,       // valid JSON, but not an object
  kMissingField,    // a required field is absent (or null)
  kWrongType,       // e.g. a string where a number belongs, 1.5 where an integer belongs
  kOutOfRange,      // NaN/Inf, negative durations, rank >= world_size, step < 0, step_s <= 0, ...
  kTooLarge,        // datagram over the size limit
  kDuplicateField,  // the same field twice, e.g. as "world_size" and "worldSize"
};
inline constexpr int kRejectReasonCount = 7;

// Stable snake_case name, e.g. "out_of_range".
const char* RejectReasonName(RejectReason reason);

struct Rejection {
  RejectReason reason;
  // Human-readable detail for the log, e.g. "rank 8 >= world_size 8".
  std::string detail;
};

// The largest datagram accepted (DESIGN.md: "a datagram over 64 KiB" is rejected).
inline constexpr size_t kMaxDatagramBytes = 64 * 1024;
// Longer job ids are rejected: they become label values downstream.
inline constexpr size_t kMaxJobBytes = 256;

// Parses one datagram into `*event` (which is cleared first). Returns nullopt when the datagram is
// valid. snake_case and lowerCamelCase field names are both accepted, unknown fields are ignored,
// and the agent-owned fields (pid, received_unix_nanos) are never taken from the sender.
std::optional<Rejection> ParseStepEvent(absl::string_view datagram, v1::StepEvent* event);

// The same verdicts through the general JSON parser only (ParseStepEvent takes a faster path for
// flat, plain-ASCII objects). For tests that compare the two, and for benchmarks.
std::optional<Rejection> ParseStepEventWithoutFastPath(absl::string_view datagram,
                                                       v1::StepEvent* event);

}  // namespace stepwatch::agent
