// The step-event datagram contract, v1 (docs/step-event.md): the fields, their names, types and
// limits, in one place. The agent's parser and the analysis library check events with Validate();
// proto/step_event_rules.json publishes the same rules as data for the clients, and tests prove
// that the file, the C++ client header and the Python client agree with the constants here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace stepwatch::step_event {

inline constexpr int kVersion = 1;
// A larger datagram is refused before it is parsed.
inline constexpr size_t kMaxDatagramBytes = 64 * 1024;
// Job ids become label values downstream; longer ones are refused.
inline constexpr size_t kMaxJobBytes = 256;
// A step (or a part of one) longer than a day is a bug or an attack, not a measurement.
inline constexpr double kMaxSeconds = 86400;
// Larger world sizes and GPU indices are not real: they would only size tables downstream.
inline constexpr int64_t kMaxWorldSize = 1 << 20;
inline constexpr int64_t kMaxGpuIndex = 1023;
// dp_rank, pp_stage, tp_rank: 32-bit, as in the proto.
inline constexpr int64_t kMaxCoordinate = std::numeric_limits<int32_t>::max();
inline constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
// "sections": at most this many named sections per event (the collector keeps as many per job).
inline constexpr size_t kMaxSections = 16;
// A section name: 1 to kMaxSectionNameBytes bytes of [A-Za-z0-9_.:/-], and none of
// kReservedSectionNames (the built-in phases, which have their own fields).
inline constexpr size_t kMaxSectionNameBytes = 64;
inline constexpr const char* kSectionNameCharacters =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:/-";
inline constexpr const char* kReservedSectionNames[] = {"data", "compute", "comm"};

// kSections: a JSON object of name -> number; its values follow the number_* limits of its rule.
enum class FieldType { kString, kInteger, kNumber, kSections };

// Every field of the datagram, in the order of kFieldRules.
enum FieldId {
  kJob,
  kRank,
  kWorldSize,
  kStep,
  kStepS,
  kDataS,
  kComputeS,
  kCommS,
  kSamples,
  kLocalRank,
  kGpu,
  kDpRank,
  kPpStage,
  kTpRank,
  kSections,
  kDropped,
  kFieldCount,
};

struct FieldRule {
  const char* name;   // snake_case, as clients send it
  const char* alias;  // lowerCamelCase (proto3 JSON), accepted too
  FieldType type;
  bool required;
  // Integers: min <= value <= max.
  int64_t int_min;
  int64_t int_max;
  // Numbers (and the values of a kSections object): finite, min < value (min_exclusive) or
  // min <= value, and value <= max.
  double number_min;
  bool min_exclusive;
  double number_max;
  // False for what the message says about its sender rather than about the step ("dropped").
  bool part_of_step;
};

// Indexed by FieldId. rank's own upper bound is world_size - 1 (checked across fields).
inline constexpr FieldRule kFieldRules[kFieldCount] = {
    {"job", "job", FieldType::kString, true, 0, 0, 0, false, 0, true},
    {"rank", "rank", FieldType::kInteger, true, 0, kMaxWorldSize - 1, 0, false, 0, true},
    {"world_size", "worldSize", FieldType::kInteger, true, 1, kMaxWorldSize, 0, false, 0, true},
    {"step", "step", FieldType::kInteger, true, 0, kMaxInt64, 0, false, 0, true},
    {"step_s", "stepS", FieldType::kNumber, true, 0, 0, 0, true, kMaxSeconds, true},
    {"data_s", "dataS", FieldType::kNumber, false, 0, 0, 0, false, kMaxSeconds, true},
    {"compute_s", "computeS", FieldType::kNumber, false, 0, 0, 0, false, kMaxSeconds, true},
    {"comm_s", "commS", FieldType::kNumber, false, 0, 0, 0, false, kMaxSeconds, true},
    {"samples", "samples", FieldType::kInteger, false, 0, kMaxInt64, 0, false, 0, true},
    {"local_rank", "localRank", FieldType::kInteger, false, 0, kMaxGpuIndex, 0, false, 0, true},
    {"gpu", "gpu", FieldType::kInteger, false, 0, kMaxGpuIndex, 0, false, 0, true},
    {"dp_rank", "dpRank", FieldType::kInteger, false, 0, kMaxCoordinate, 0, false, 0, true},
    {"pp_stage", "ppStage", FieldType::kInteger, false, 0, kMaxCoordinate, 0, false, 0, true},
    {"tp_rank", "tpRank", FieldType::kInteger, false, 0, kMaxCoordinate, 0, false, 0, true},
    {"sections", "sections", FieldType::kSections, false, 0, 0, 0, false, kMaxSeconds, true},
    {"dropped", "dropped", FieldType::kInteger, false, 0, kMaxInt64, 0, false, 0, false},
};

// The field named `name` (either spelling), or -1.
int FindField(absl::string_view name);

// One named section of an event: (name, seconds).
using Section = std::pair<std::string, double>;

// One event's values, whatever carried them (a datagram, a batch from an agent).
struct Fields {
  absl::string_view job;
  int64_t rank = 0;
  int64_t world_size = 0;
  int64_t step = 0;
  double step_seconds = 0;
  std::optional<double> data_seconds;
  std::optional<double> compute_seconds;
  std::optional<double> comm_seconds;
  std::optional<int64_t> samples;
  std::optional<int64_t> local_rank;
  std::optional<int64_t> gpu;
  std::optional<int64_t> dp_rank;
  std::optional<int64_t> pp_stage;
  std::optional<int64_t> tp_rank;
  // Empty when the event has none ("sections" absent and {} are the same).
  absl::Span<const Section> sections;
  std::optional<int64_t> dropped;
};

// The job id: 1 to kMaxJobBytes bytes of UTF-8 without control characters (C0, DEL, C1: they
// would reach terminals and label values). InvalidArgument naming the job otherwise.
absl::Status ValidateJob(absl::string_view job);
// One integer or number field against its range; InvalidArgument naming the field otherwise.
absl::Status ValidateInteger(FieldId field, int64_t value);
absl::Status ValidateNumber(FieldId field, double value);
// A section name: 1 to kMaxSectionNameBytes bytes of kSectionNameCharacters, not a built-in phase
// (data, compute, comm). InvalidArgument starting with "sections" otherwise.
absl::Status ValidateSectionName(absl::string_view name);
// At most kMaxSections entries, each with a valid name given once and a finite value of 0 to
// kMaxSeconds. InvalidArgument starting with "sections" otherwise.
absl::Status ValidateSections(absl::Span<const Section> sections);
// Every rule, fields in kFieldRules order, then rank < world_size. The first broken rule is the
// error (InvalidArgument; its message starts with the field's name).
absl::Status Validate(const Fields& fields);

}  // namespace stepwatch::step_event
