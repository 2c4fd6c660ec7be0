// Parsing of the step-event datagram (docs/step-event.md): one JSON object in, one v1::StepEvent or
// a reason for rejecting it out. The rules themselves live in common/step_event_rules.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "common/step_event_rules.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::agent {

// Why a datagram was rejected. The names (RejectReasonName) are metric label values: never rename.
enum class RejectReason {
  kNotJson = 0,     // not valid UTF-8 JSON
  kNotObject,       // valid JSON, but not an object
  kMissingField,    // a required field is absent (or null)
  kWrongType,       // e.g. a string where a number belongs, 1.5 where an integer belongs
  kOutOfRange,      // any rule of common/step_event_rules.h: rank >= world_size, step_s <= 0, ...
  kTooLarge,        // datagram over the size limit
  kDuplicateField,  // the same field twice, e.g. as "world_size" and "worldSize"
  kNotOwner,        // (job, rank) is bound to another live process (checked by the ingest server)
  // The sending process or its user owns as many (job, rank) pairs as --max-ranks-per-process /
  // --max-ranks-per-user allow (checked by the ingest server).
  kTenantLimit,
};
inline constexpr int kRejectReasonCount = 9;

// Stable snake_case name, e.g. "out_of_range".
const char* RejectReasonName(RejectReason reason);

struct Rejection {
  RejectReason reason;
  // Human-readable detail for the log, e.g. "rank 8 >= world_size 8".
  std::string detail;
};

// The largest datagram accepted, and the longest job id (docs/step-event.md).
inline constexpr size_t kMaxDatagramBytes = step_event::kMaxDatagramBytes;
inline constexpr size_t kMaxJobBytes = step_event::kMaxJobBytes;

// What a message says about its sender rather than about the step.
struct ClientReport {
  // The optional "dropped" field: events the client failed to send since its last message that
  // left (0 when absent: older clients do not send it).
  uint64_t dropped = 0;
};

// Parses one datagram into `*event` (which is cleared first). Returns nullopt when the datagram is
// valid. snake_case and lowerCamelCase field names are both accepted, unknown fields are ignored,
// and the agent-owned fields (pid, received_unix_nanos) are never taken from the sender.
// `report` (may be null) receives the sender's own counters.
std::optional<Rejection> ParseStepEvent(absl::string_view datagram, v1::StepEvent* event,
                                        ClientReport* report = nullptr);

// The same verdicts through the general JSON parser only (ParseStepEvent takes a faster path for
// flat, plain-ASCII objects, with a flat "sections" object among them). For tests that compare
// the two, and for benchmarks.
std::optional<Rejection> ParseStepEventWithoutFastPath(absl::string_view datagram,
                                                       v1::StepEvent* event,
                                                       ClientReport* report = nullptr);

}  // namespace stepwatch::agent
