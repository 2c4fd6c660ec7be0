#include "common/step_event_rules.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/utf8.h"

namespace stepwatch::step_event {

namespace {

bool IsControl(uint32_t cp) { return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F); }

// The checks of the rules table without building any message: every event of every batch goes
// through here, and almost all of them pass. True only when every rule holds; a false answer is
// explained by the detailed checks in Validate().
constexpr bool IntegerOk(FieldId id, int64_t v) {
  return v >= kFieldRules[id].int_min && v <= kFieldRules[id].int_max;
}
constexpr bool NumberOk(FieldId id, double v) {
  const FieldRule& r = kFieldRules[id];
  // NaN fails every comparison; infinities fail the upper or lower bound.
  return (r.min_exclusive ? v > r.number_min : v >= r.number_min) && v <= r.number_max;
}
bool OptionalIntegerOk(FieldId id, const std::optional<int64_t>& v) {
  return !v.has_value() || IntegerOk(id, *v);
}
bool OptionalNumberOk(FieldId id, const std::optional<double>& v) {
  return !v.has_value() || NumberOk(id, *v);
}
bool PrintableAscii(absl::string_view text) {
  bool ok = true;
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    ok &= (c >= 0x20 && c < 0x7F);
  }
  return ok;
}
bool SectionNameCharacter(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == ':' || c == '/' || c == '-';
}
bool SectionNameOk(absl::string_view name) {
  if (name.empty() || name.size() > kMaxSectionNameBytes) return false;
  for (const char ch : name) {
    if (!SectionNameCharacter(static_cast<unsigned char>(ch))) return false;
  }
  for (const char* reserved : kReservedSectionNames) {
    if (name == reserved) return false;
  }
  return true;
}
bool SectionsOk(absl::Span<const Section> sections) {
  if (sections.size() > kMaxSections) return false;
  for (size_t i = 0; i < sections.size(); ++i) {
    if (!SectionNameOk(sections[i].first) || !NumberOk(kSections, sections[i].second)) return false;
    for (size_t j = 0; j < i; ++j) {
      if (sections[j].first == sections[i].first) return false;
    }
  }
  return true;
}
bool AllRulesHold(const Fields& f) {
  return !f.job.empty() && f.job.size() <= kMaxJobBytes && PrintableAscii(f.job) &&
         IntegerOk(kRank, f.rank) && IntegerOk(kWorldSize, f.world_size) &&
         IntegerOk(kStep, f.step) && f.rank < f.world_size && NumberOk(kStepS, f.step_seconds) &&
         OptionalNumberOk(kDataS, f.data_seconds) &&
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
  if (job.empty()) return absl::InvalidArgumentError("job must not be empty");
  if (job.size() > kMaxJobBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job is ", job.size(), " bytes, the limit is ", kMaxJobBytes));
  }
  // Fast path: job ids are almost always printable ASCII, checked without decoding.
  if (PrintableAscii(job)) return absl::OkStatus();
  for (size_t i = 0; i < job.size();) {
    const Utf8Sequence seq = DecodeUtf8At(job, i);
    if (seq.length == 0) {
      return absl::InvalidArgumentError(absl::StrCat("job is not UTF-8 at byte ", i));
    }
    if (IsControl(seq.code_point)) {
      return absl::InvalidArgumentError(
          absl::StrCat("job contains a control character at byte ", i));
    }
    i += seq.length;
  }
  return absl::OkStatus();
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
  if (SectionNameOk(name)) return absl::OkStatus();
  // Names are quoted only once known to be short printable ASCII: they reach the agent's log.
  if (name.empty()) return absl::InvalidArgumentError("sections: a name is empty");
  if (name.size() > kMaxSectionNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("sections: a name is ", name.size(),
                                                   " bytes, the limit is ", kMaxSectionNameBytes));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    if (!SectionNameCharacter(static_cast<unsigned char>(name[i]))) {
      return absl::InvalidArgumentError(
          absl::StrCat("sections: a name has a character other than A-Za-z0-9_.:/- at byte ", i));
    }
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
