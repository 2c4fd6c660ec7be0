#include "agent/step_event_parser.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/json.h"

namespace stepwatch::agent {

const char* RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kNotJson:
      return "not_json";
    case RejectReason::kNotObject:
      return "not_object";
    case RejectReason::kMissingField:
      return "missing_field";
    case RejectReason::kWrongType:
      return "wrong_type";
    case RejectReason::kOutOfRange:
      return "out_of_range";
    case RejectReason::kTooLarge:
      return "too_large";
    case RejectReason::kDuplicateField:
      return "duplicate_field";
  }
  return "unknown";
}

namespace {

enum class Kind { kString, kInt32, kInt64, kDouble };

// Which constraint a numeric field has beyond its type.
enum class Bound { kNone, kNonNegative, kPositive };

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
  kFieldCount,
};

struct FieldSpec {
  const char* snake;
  const char* camel;
  Kind kind;
  bool required;
  Bound bound;
};

// Indexed by FieldId.
constexpr FieldSpec kFields[kFieldCount] = {
    {"job", "job", Kind::kString, true, Bound::kNone},
    {"rank", "rank", Kind::kInt32, true, Bound::kNonNegative},
    {"world_size", "worldSize", Kind::kInt32, true, Bound::kPositive},
    {"step", "step", Kind::kInt64, true, Bound::kNonNegative},
    {"step_s", "stepS", Kind::kDouble, true, Bound::kPositive},
    {"data_s", "dataS", Kind::kDouble, false, Bound::kNonNegative},
    {"compute_s", "computeS", Kind::kDouble, false, Bound::kNonNegative},
    {"comm_s", "commS", Kind::kDouble, false, Bound::kNonNegative},
    {"samples", "samples", Kind::kInt64, false, Bound::kNonNegative},
    {"local_rank", "localRank", Kind::kInt32, false, Bound::kNonNegative},
    {"gpu", "gpu", Kind::kInt32, false, Bound::kNonNegative},
    {"dp_rank", "dpRank", Kind::kInt32, false, Bound::kNonNegative},
    {"pp_stage", "ppStage", Kind::kInt32, false, Bound::kNonNegative},
    {"tp_rank", "tpRank", Kind::kInt32, false, Bound::kNonNegative},
};

int FindField(absl::string_view key) {
  for (int i = 0; i < kFieldCount; ++i) {
    if (key == kFields[i].snake || key == kFields[i].camel) return i;
  }
  return -1;
}

// A parsed field value before range checks.
struct Slot {
  bool present = false;
  std::string text;
  int64_t integer = 0;
  double number = 0;
};

Rejection Reject(RejectReason reason, std::string detail) { return {reason, std::move(detail)}; }

// Converts one JSON member into its slot, checking the type and the bound.
std::optional<Rejection> TakeValue(const FieldSpec& spec, const json::Value& v, Slot* slot) {
  const char* name = spec.snake;
  if (spec.kind == Kind::kString) {
    if (!v.is_string()) {
      return Reject(RejectReason::kWrongType,
                    absl::StrCat(name, " must be a string, got ", json::Value::TypeName(v.type())));
    }
    slot->text = v.as_string();
    slot->present = true;
    return std::nullopt;
  }
  if (!v.is_number()) {
    return Reject(RejectReason::kWrongType,
                  absl::StrCat(name, " must be a number, got ", json::Value::TypeName(v.type())));
  }
  if (spec.kind == Kind::kDouble) {
    const double d = v.as_double();
    if (!std::isfinite(d))
      return Reject(RejectReason::kOutOfRange, absl::StrCat(name, " is not finite"));
    if (spec.bound == Bound::kPositive && !(d > 0)) {
      return Reject(RejectReason::kOutOfRange, absl::StrCat(name, " must be > 0, got ", d));
    }
    if (spec.bound == Bound::kNonNegative && d < 0) {
      return Reject(RejectReason::kOutOfRange, absl::StrCat(name, " must be >= 0, got ", d));
    }
    slot->number = d;
    slot->present = true;
    return std::nullopt;
  }
  // Integer fields: the literal must be integral ("3", not "3.0" or "3e0").
  if (!v.is_integer()) {
    const double d = v.as_double();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) >= 9.2e18) {
      return Reject(RejectReason::kOutOfRange, absl::StrCat(name, " does not fit in 64 bits"));
    }
    return Reject(RejectReason::kWrongType, absl::StrCat(name, " must be an integer, got ", d));
  }
  const int64_t i = v.as_int64();
  if (spec.kind == Kind::kInt32 &&
      (i > std::numeric_limits<int32_t>::max() || i < std::numeric_limits<int32_t>::min())) {
    return Reject(RejectReason::kOutOfRange, absl::StrCat(name, " does not fit in 32 bits: ", i));
  }
  if (spec.bound == Bound::kPositive && i <= 0) {
    return Reject(RejectReason::kOutOfRange, absl::StrCat(name, " must be > 0, got ", i));
  }
  if (spec.bound == Bound::kNonNegative && i < 0) {
    return Reject(RejectReason::kOutOfRange, absl::StrCat(name, " must be >= 0, got ", i));
  }
  slot->integer = i;
  slot->present = true;
  return std::nullopt;
}

}  // namespace

std::optional<Rejection> ParseStepEvent(absl::string_view datagram, v1::StepEvent* event) {
  event->Clear();
  if (datagram.size() > kMaxDatagramBytes) {
    return Reject(RejectReason::kTooLarge, absl::StrCat("datagram of ", datagram.size(),
                                                        " bytes exceeds ", kMaxDatagramBytes));
  }
  // Step events are flat; a little nesting is allowed for unknown fields.
  json::ParseOptions options;
  options.max_depth = 8;
  absl::StatusOr<json::Value> parsed = json::Parse(datagram, options);
  if (!parsed.ok()) return Reject(RejectReason::kNotJson, std::string(parsed.status().message()));
  if (!parsed->is_object()) {
    return Reject(RejectReason::kNotObject,
                  absl::StrCat("expected an object, got ", json::Value::TypeName(parsed->type())));
  }

  Slot slots[kFieldCount];
  for (const auto& [key, value] : parsed->as_object()) {
    const int id = FindField(key);
    if (id < 0) continue;  // unknown fields are ignored (forward compatibility)
    const FieldSpec& spec = kFields[id];
    if (slots[id].present) {
      return Reject(RejectReason::kDuplicateField, absl::StrCat(spec.snake, " given twice"));
    }
    // proto3 JSON: null means "absent".
    if (value.is_null()) continue;
    if (auto rejection = TakeValue(spec, value, &slots[id])) return rejection;
  }
  for (int id = 0; id < kFieldCount; ++id) {
    if (kFields[id].required && !slots[id].present) {
      return Reject(RejectReason::kMissingField, absl::StrCat(kFields[id].snake, " is required"));
    }
  }
  const std::string& job = slots[kJob].text;
  if (job.empty()) return Reject(RejectReason::kOutOfRange, "job must not be empty");
  if (job.size() > kMaxJobBytes) {
    return Reject(RejectReason::kOutOfRange,
                  absl::StrCat("job is ", job.size(), " bytes, the limit is ", kMaxJobBytes));
  }
  if (slots[kRank].integer >= slots[kWorldSize].integer) {
    return Reject(
        RejectReason::kOutOfRange,
        absl::StrCat("rank ", slots[kRank].integer, " >= world_size ", slots[kWorldSize].integer));
  }

  event->set_job(job);
  event->set_rank(static_cast<int32_t>(slots[kRank].integer));
  event->set_world_size(static_cast<int32_t>(slots[kWorldSize].integer));
  event->set_step(slots[kStep].integer);
  event->set_step_s(slots[kStepS].number);
  if (slots[kDataS].present) event->set_data_s(slots[kDataS].number);
  if (slots[kComputeS].present) event->set_compute_s(slots[kComputeS].number);
  if (slots[kCommS].present) event->set_comm_s(slots[kCommS].number);
  if (slots[kSamples].present) event->set_samples(slots[kSamples].integer);
  if (slots[kLocalRank].present)
    event->set_local_rank(static_cast<int32_t>(slots[kLocalRank].integer));
  if (slots[kGpu].present) event->set_gpu(static_cast<int32_t>(slots[kGpu].integer));
  if (slots[kDpRank].present) event->set_dp_rank(static_cast<int32_t>(slots[kDpRank].integer));
  if (slots[kPpStage].present) event->set_pp_stage(static_cast<int32_t>(slots[kPpStage].integer));
  if (slots[kTpRank].present) event->set_tp_rank(static_cast<int32_t>(slots[kTpRank].integer));
  return std::nullopt;
}

}  // namespace stepwatch::agent
