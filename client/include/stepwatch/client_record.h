// stepwatch C++ client: one step's event as sent (StepRecord) and the checks it passes before it
// leaves. The limits and checks are the agent's own (stepwatch/detail/step_event_rules.h, the
// definitions the agent and collector use too); what breaks them is refused here, where the caller
// hears of it, not silently by the agent. Included by stepwatch/client.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "stepwatch/detail/step_event_rules.h"

namespace stepwatch {

// The step-event limits (docs/step-event.md) in this client's types.
// The largest message the agent reads.
inline constexpr size_t kMaxDatagramBytes = step_event::kMaxDatagramBytes;
// Job ids: 1 to kMaxJobBytes bytes of UTF-8 without control characters.
inline constexpr size_t kMaxJobBytes = step_event::kMaxJobBytes;
// step_s, data_s, compute_s, comm_s: at most a day.
inline constexpr double kMaxSeconds = step_event::kMaxSeconds;
// world_size (rank is below it); local_rank and gpu. dp_rank, pp_stage, tp_rank: any int >= 0.
inline constexpr int kMaxWorldSize = static_cast<int>(step_event::kMaxWorldSize);
inline constexpr int kMaxGpuIndex = static_cast<int>(step_event::kMaxGpuIndex);
// Named sections ("sections"): at most kMaxSections per event (and per Reporter here), each name
// 1 to kMaxSectionNameBytes bytes of [A-Za-z0-9_.:/-] other than the built-in phases' names
// (data, compute, comm); values 0 to kMaxSeconds.
inline constexpr int kMaxSections = static_cast<int>(step_event::kMaxSections);
inline constexpr size_t kMaxSectionNameBytes = step_event::kMaxSectionNameBytes;

// Phases of a step, reported as data_s, compute_s and comm_s.
enum class Phase : int { kData = 0, kCompute = 1, kComm = 2 };

// One step of one rank, as sent. Absent optionals are left out of the JSON.
struct StepRecord {
  int64_t step = 0;                 // >= 0
  double step_s = 0;                // > 0, finite
  std::optional<double> data_s;     // >= 0, finite
  std::optional<double> compute_s;  // >= 0, finite
  std::optional<double> comm_s;     // >= 0, finite
  std::optional<int64_t> samples;   // >= 0
  // Named sections, by the Reporter's section ids (Reporter::SectionId): section_s[id] (>= 0,
  // finite) is sent under the section's name when bit `id` of section_mask is set. Fixed-size, so
  // that queueing a record allocates nothing.
  uint16_t section_mask = 0;
  double section_s[kMaxSections] = {};

  void SetSection(int id, double seconds) noexcept {
    if (id < 0 || id >= kMaxSections) return;
    section_mask = static_cast<uint16_t>(section_mask | (1u << id));
    section_s[id] = seconds;
  }
};

namespace client_internal {

// An optional duration of `field`: absent, or finite and within the field's range.
constexpr bool ValidDuration(step_event::FieldId field, const std::optional<double>& d) noexcept {
  return !d.has_value() || step_event::NumberInRange(field, *d);
}

}  // namespace client_internal

// Why the agent would refuse `job` (nullptr when it would not): empty, over kMaxJobBytes, not
// UTF-8, or a control character (U+0000..U+001F, U+007F..U+009F).
inline const char* ValidateJob(const std::string& job) noexcept {
  using step_event::JobProblem;
  static_assert(kMaxJobBytes == 256, "the message below names the limit");
  switch (step_event::CheckJob(job)) {
    case JobProblem::kNone:
      return nullptr;
    case JobProblem::kEmpty:
      return "job id is empty";
    case JobProblem::kTooLong:
      return "job id is over 256 bytes";
    case JobProblem::kNotUtf8:
      return "job id is not UTF-8";
    case JobProblem::kControlCharacter:
      break;
  }
  return "job id contains a control character";
}

// Why the agent would refuse an event with these values (nullptr when it would not).
inline const char* ValidateStepRecord(const StepRecord& r) noexcept {
  using client_internal::ValidDuration;
  namespace rules = step_event;
  if (!rules::IntegerInRange(rules::kStep, r.step)) return "invalid step event: step < 0";
  if (!rules::NumberInRange(rules::kStepS, r.step_s)) {
    return "invalid step event: step_s must be > 0 and at most a day";
  }
  if (!ValidDuration(rules::kDataS, r.data_s) || !ValidDuration(rules::kComputeS, r.compute_s) ||
      !ValidDuration(rules::kCommS, r.comm_s)) {
    return "invalid step event: a phase duration is negative, not finite or over a day";
  }
  if (r.samples && !rules::IntegerInRange(rules::kSamples, *r.samples)) {
    return "invalid step event: samples < 0";
  }
  for (int id = 0; id < kMaxSections; ++id) {
    if ((r.section_mask & (1u << id)) != 0 && !ValidDuration(rules::kSections, r.section_s[id])) {
      return "invalid step event: a section duration is negative, not finite or over a day";
    }
  }
  return nullptr;
}

// Why the agent would refuse `name` as a section name (nullptr when it would not).
inline const char* ValidateSectionName(std::string_view name) noexcept {
  using step_event::SectionNameProblem;
  static_assert(kMaxSectionNameBytes == 64, "the message below names the limit");
  switch (step_event::CheckSectionName(name)) {
    case SectionNameProblem::kNone:
      return nullptr;
    case SectionNameProblem::kEmpty:
      return "section name is empty";
    case SectionNameProblem::kTooLong:
      return "section name is over 64 bytes";
    case SectionNameProblem::kBadCharacter:
      return "section name has a character other than A-Za-z0-9_.:/-";
    case SectionNameProblem::kReserved:
      break;
  }
  return "section name is a built-in phase (data, compute, comm)";
}

}  // namespace stepwatch
