// The step-event datagram contract, v1 (docs/step-event.md), with the messages that say what
// breaks it. The agent's parser and the analysis library check events with Validate(). The
// constants, the field table and the checks themselves live in the header-only
// stepwatch/detail/step_event_rules.h, which the C++ client includes too; this header adds
// Abseil-typed validation on top. proto/step_event_rules.json publishes the same rules as data for
// the other clients, and tests prove that the file and the Python client agree with them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepwatch/detail/step_event_rules.h"

namespace stepwatch::step_event {

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
