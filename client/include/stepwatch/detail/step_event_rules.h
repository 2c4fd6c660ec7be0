// The step-event datagram contract, v1 (docs/step-event.md): the limits, the field table and the
// checks that need no messages, header-only and standard library only. The C++ client checks
// what it sends with them; common/step_event_rules.h adds Validate() and its messages on top for
// the agent and the collector. One definition, so the client cannot drift from the agent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "stepwatch/detail/utf8.h"

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

// The range checks of the table. NaN fails every comparison; infinities fail a bound.
constexpr bool IntegerInRange(FieldId id, int64_t v) noexcept {
  return v >= kFieldRules[id].int_min && v <= kFieldRules[id].int_max;
}
constexpr bool NumberInRange(FieldId id, double v) noexcept {
  const FieldRule& r = kFieldRules[id];
  return (r.min_exclusive ? v > r.number_min : v >= r.number_min) && v <= r.number_max;
}

// C0, DEL and C1: they would reach terminals and label values.
constexpr bool IsControlCodePoint(uint32_t cp) noexcept {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F);
}
constexpr bool IsPrintableAscii(std::string_view text) noexcept {
  bool ok = true;
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    ok &= (c >= 0x20 && c < 0x7F);
  }
  return ok;
}

// What breaks the job id rule: 1 to kMaxJobBytes bytes of UTF-8 without control characters.
enum class JobProblem { kNone, kEmpty, kTooLong, kNotUtf8, kControlCharacter };
// The first problem of `job`; *at (when given) is the byte it is at for kNotUtf8 and
// kControlCharacter.
constexpr JobProblem CheckJob(std::string_view job, size_t* at = nullptr) noexcept {
  if (job.empty()) return JobProblem::kEmpty;
  if (job.size() > kMaxJobBytes) return JobProblem::kTooLong;
  // Fast path: job ids are almost always printable ASCII, checked without decoding.
  if (IsPrintableAscii(job)) return JobProblem::kNone;
  for (size_t i = 0; i < job.size();) {
    const detail::Utf8Sequence seq = detail::DecodeUtf8At(job.data(), job.size(), i);
    if (seq.length == 0 || IsControlCodePoint(seq.code_point)) {
      if (at != nullptr) *at = i;
      return seq.length == 0 ? JobProblem::kNotUtf8 : JobProblem::kControlCharacter;
    }
    i += seq.length;
  }
  return JobProblem::kNone;
}

constexpr bool IsSectionNameCharacter(char ch) noexcept {
  const unsigned char c = static_cast<unsigned char>(ch);
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == ':' || c == '/' || c == '-';
}

// What breaks the section name rule (kMaxSectionNameBytes, kSectionNameCharacters,
// kReservedSectionNames).
enum class SectionNameProblem { kNone, kEmpty, kTooLong, kBadCharacter, kReserved };
// The first problem of `name`; *at (when given) is the byte it is at for kBadCharacter.
constexpr SectionNameProblem CheckSectionName(std::string_view name,
                                              size_t* at = nullptr) noexcept {
  if (name.empty()) return SectionNameProblem::kEmpty;
  if (name.size() > kMaxSectionNameBytes) return SectionNameProblem::kTooLong;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsSectionNameCharacter(name[i])) {
      if (at != nullptr) *at = i;
      return SectionNameProblem::kBadCharacter;
    }
  }
  for (const char* reserved : kReservedSectionNames) {
    if (name == reserved) return SectionNameProblem::kReserved;
  }
  return SectionNameProblem::kNone;
}

}  // namespace stepwatch::step_event
