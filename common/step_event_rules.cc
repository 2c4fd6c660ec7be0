#include "common/step_event_rules.h"

#include <cmath>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace stepwatch::step_event {

namespace {

// The header-only checks take std::string_view; absl::string_view is its own type here.
std::string_view StdView(absl::string_view s) { return std::string_view(s.data(), s.size()); }

// The checks of the rules table without building any message: every event of every batch goes
// through here, and almost all of them pass. True only when every rule holds; a false answer is
// explained by the detailed checks in Validate().
bool OptionalIntegerOk(FieldId id, const std::optional<int64_t>& v) {
  return !v.has_value() || IntegerInRange(id, *v);
}
bool OptionalNumberOk(FieldId id, const std::optional<double>& v) {
  return !v.has_value() || NumberInRange(id, *v);
}
bool SectionNameOk(absl::string_view name) {
  return CheckSectionName(StdView(name)) == SectionNameProblem::kNone;
}
bool SectionsOk(absl::Span<const Section> sections) {
  if (sections.size() > kMaxSections) return false;
  for (size_t i = 0; i < sections.size(); ++i) {
    if (!SectionNameOk(sections[i].first) || !NumberInRange(kSections, sections[i].second))
      return false;
    for (size_t j = 0; j < i; ++j) {
      if (sections[j].first == sections[i].first) return false;
    }
  }
  return true;
}
bool AllRulesHold(const Fields& f) {
  return !f.job.empty() && f.job.size() <= kMaxJobBytes && IsPrintableAscii(StdView(f.job)) &&
         IntegerInRange(kRank, f.rank) && IntegerInRange(kWorldSize, f.world_size) &&
         IntegerInRange(kStep, f.step) && f.rank < f.world_size &&
         NumberInRange(kStepS, f.step_seconds) && OptionalNumberOk(kDataS, f.data_seconds) &&
         OptionalNumberOk(kComputeS, f.compute_seconds) &&
         OptionalNumberOk(kCommS, f.comm_seconds) && OptionalIntegerOk(kSamples, f.samples) &&
         OptionalIntegerOk(kLocalRank, f.local_rank) && OptionalIntegerOk(kGpu, f.gpu) &&
         OptionalIntegerOk(kDpRank, f.dp_rank) && OptionalIntegerOk(kPpStage, f.pp_stage) &&
         OptionalIntegerOk(kTpRank, f.tp_rank) && OptionalIntegerOk(kDropped, f.dropped) &&
         SectionsOk(f.sections);
}

}  // namespace

int FindField(absl::string_view name) {
  for (int i = 0; i < kFieldCount; ++i) {
    if (name == kFieldRules[i].name || name == kFieldRules[i].alias) return i;
  }
  return -1;
}

absl::Status ValidateJob(absl::string_view job) {
  size_t at = 0;
  switch (CheckJob(StdView(job), &at)) {
    case JobProblem::kNone:
      return absl::OkStatus();
    case JobProblem::kEmpty:
      return absl::InvalidArgumentError("job must not be empty");
    case JobProblem::kTooLong:
      return absl::InvalidArgumentError(
          absl::StrCat("job is ", job.size(), " bytes, the limit is ", kMaxJobBytes));
    case JobProblem::kNotUtf8:
      return absl::InvalidArgumentError(absl::StrCat("job is not UTF-8 at byte ", at));
    case JobProblem::kControlCharacter:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("job contains a control character at byte ", at));
}

absl::Status ValidateInteger(FieldId field, int64_t value) {
  const FieldRule& rule = kFieldRules[field];
  if (value < rule.int_min) {
    return absl::InvalidArgumentError(
        absl::StrCat(rule.name, " must be >= ", rule.int_min, ", got ", value));
  }
  if (value > rule.int_max) {
    return absl::InvalidArgumentError(
        absl::StrCat(rule.name, " ", value, " is over ", rule.int_max));
  }
  return absl::OkStatus();
}

absl::Status ValidateNumber(FieldId field, double value) {
  const FieldRule& rule = kFieldRules[field];
  if (!std::isfinite(value))
    return absl::InvalidArgumentError(absl::StrCat(rule.name, " is not finite"));
  if (rule.min_exclusive ? !(value > rule.number_min) : value < rule.number_min) {
    return absl::InvalidArgumentError(
        absl::StrCat(rule.name, " must be ", rule.min_exclusive ? "> " : ">= ", rule.number_min,
                     ", got ", value));
  }
  if (value > rule.number_max) {
    return absl::InvalidArgumentError(
        absl::StrCat(rule.name, " ", value, " s is over ", rule.number_max));
  }
  return absl::OkStatus();
}

absl::Status ValidateSectionName(absl::string_view name) {
  size_t at = 0;
  // Names are quoted only once known to be short printable ASCII: they reach the agent's log.
  switch (CheckSectionName(StdView(name), &at)) {
    case SectionNameProblem::kNone:
      return absl::OkStatus();
    case SectionNameProblem::kEmpty:
      return absl::InvalidArgumentError("sections: a name is empty");
    case SectionNameProblem::kTooLong:
      return absl::InvalidArgumentError(absl::StrCat(
          "sections: a name is ", name.size(), " bytes, the limit is ", kMaxSectionNameBytes));
    case SectionNameProblem::kBadCharacter:
      return absl::InvalidArgumentError(
          absl::StrCat("sections: a name has a character other than A-Za-z0-9_.:/- at byte ", at));
    case SectionNameProblem::kReserved:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "sections: \"", name, "\" is a built-in phase (report it as ", name, "_s), not a section"));
}

absl::Status ValidateSections(absl::Span<const Section> sections) {
  if (SectionsOk(sections)) return absl::OkStatus();
  if (sections.size() > kMaxSections) {
    return absl::InvalidArgumentError(
        absl::StrCat("sections: ", sections.size(), " entries, the limit is ", kMaxSections));
  }
  for (size_t i = 0; i < sections.size(); ++i) {
    const auto& [name, seconds] = sections[i];
    if (absl::Status s = ValidateSectionName(name); !s.ok()) return s;
    for (size_t j = 0; j < i; ++j) {
      if (sections[j].first == name) {
        return absl::InvalidArgumentError(absl::StrCat("sections.", name, " given twice"));
      }
    }
    if (absl::Status s = ValidateNumber(kSections, seconds); !s.ok()) {
      // "sections is not finite" -> "sections.forward is not finite".
      return absl::InvalidArgumentError(
          absl::StrCat("sections.", name, s.message().substr(sizeof("sections") - 1)));
    }
  }
  return absl::OkStatus();
}

absl::Status Validate(const Fields& f) {
  if (AllRulesHold(f)) return absl::OkStatus();
  if (absl::Status s = ValidateJob(f.job); !s.ok()) return s;
  for (auto [id, value] :
       {std::pair{kRank, f.rank}, std::pair{kWorldSize, f.world_size}, std::pair{kStep, f.step}}) {
    if (absl::Status s = ValidateInteger(id, value); !s.ok()) return s;
  }
  if (absl::Status s = ValidateNumber(kStepS, f.step_seconds); !s.ok()) return s;
  for (auto [id, value] :
       {std::pair{kDataS, f.data_seconds}, std::pair{kComputeS, f.compute_seconds},
        std::pair{kCommS, f.comm_seconds}}) {
    if (!value.has_value()) continue;
    if (absl::Status s = ValidateNumber(id, *value); !s.ok()) return s;
  }
  for (auto [id, value] :
       {std::pair{kSamples, f.samples}, std::pair{kLocalRank, f.local_rank}, std::pair{kGpu, f.gpu},
        std::pair{kDpRank, f.dp_rank}, std::pair{kPpStage, f.pp_stage},
        std::pair{kTpRank, f.tp_rank}, std::pair{kDropped, f.dropped}}) {
    if (!value.has_value()) continue;
    if (absl::Status s = ValidateInteger(id, *value); !s.ok()) return s;
  }
  if (absl::Status s = ValidateSections(f.sections); !s.ok()) return s;
  if (f.rank >= f.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", f.rank, " >= world_size ", f.world_size));
  }
  return absl::OkStatus();
}

}  // namespace stepwatch::step_event
