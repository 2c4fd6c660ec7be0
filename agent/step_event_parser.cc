#include "agent/step_event_parser.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/step_event_rules.h"

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
    case RejectReason::kNotOwner:
      return "not_owner";
    case RejectReason::kTenantLimit:
      return "tenant_limit";
  }
  return "unknown";
}

namespace {

using step_event::FieldId;
using step_event::FieldType;
using step_event::FindField;
using step_event::kFieldCount;
using step_event::kFieldRules;

// A parsed field value before range checks.
struct Slot {
  bool present = false;
  std::string text;
  int64_t integer = 0;
  double number = 0;
  std::vector<step_event::Section> sections;  // kSections, in document order
};

Rejection Reject(RejectReason reason, std::string detail) { return {reason, std::move(detail)}; }

// Converts one JSON member into its slot, checking its type; the ranges are checked once every
// field is known (step_event::Validate).
std::optional<Rejection> TakeValue(const step_event::FieldRule& rule, const json::Value& v,
                                   Slot* slot) {
  const char* name = rule.name;
  if (rule.type == FieldType::kSections) {
    // An object of name -> number; names and values are checked with the other rules.
    if (!v.is_object()) {
      return Reject(RejectReason::kWrongType, absl::StrCat(name, " must be an object, got ",
                                                           json::Value::TypeName(v.type())));
    }
    const json::Value::Object& members = v.as_object();
    slot->sections.reserve(members.size());
    for (const auto& [key, value] : members) {
      if (!value.is_number()) {
        // The name is not quoted: it is not checked yet and the detail reaches the log.
        return Reject(RejectReason::kWrongType, absl::StrCat(name, " values must be numbers, got ",
                                                             json::Value::TypeName(value.type())));
      }
      slot->sections.emplace_back(key, value.as_double());
    }
    slot->present = true;
    return std::nullopt;
  }
  if (rule.type == FieldType::kString) {
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
  if (rule.type == FieldType::kNumber) {
    slot->number = v.as_double();
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
  slot->integer = v.as_int64();
  slot->present = true;
  return std::nullopt;
}

// A known field as it appeared in the document, in document order.
struct Member {
  int id;
  const json::Value* value;
};

// Type-checks the members in document order, then checks presence. Fills `slots`.
std::optional<Rejection> TakeMembers(const Member* members, size_t count, Slot* slots) {
  for (size_t i = 0; i < count; ++i) {
    const step_event::FieldRule& rule = kFieldRules[members[i].id];
    Slot& slot = slots[members[i].id];
    if (slot.present) {
      return Reject(RejectReason::kDuplicateField, absl::StrCat(rule.name, " given twice"));
    }
    // proto3 JSON: null means "absent".
    if (members[i].value->is_null()) continue;
    if (auto rejection = TakeValue(rule, *members[i].value, &slot)) return rejection;
  }
  for (int id = 0; id < kFieldCount; ++id) {
    if (kFieldRules[id].required && !slots[id].present) {
      return Reject(RejectReason::kMissingField,
                    absl::StrCat(kFieldRules[id].name, " is required"));
    }
  }
  return std::nullopt;
}

// The fast path for the common datagram: one flat object with plain ASCII strings. It builds no
// document tree. Anything unusual (nesting, escapes, non-ASCII, repeated keys, syntax errors, huge
// numbers) returns false and the strict general parser decides, so both paths give the same
// verdict on every input.
class FlatScanner {
 public:
  explicit FlatScanner(absl::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  // On true, members()/count() hold the known fields in document order.
  bool Scan() {
    SkipWhitespace();
    if (!Consume('{')) return false;
    SkipWhitespace();
    if (Consume('}')) return AtEnd();
    while (true) {
      SkipWhitespace();
      absl::string_view key;
      if (!Consume('"') || !ScanPlainString(&key)) return false;
      SkipWhitespace();
      if (!Consume(':')) return false;
      SkipWhitespace();
      const int id = FindField(key);
      if (id >= 0) {
        if (seen_[id] || count_ >= kFieldCount) return false;
        seen_[id] = true;
        if (!(kFieldRules[id].type == FieldType::kSections && p_ != end_ && *p_ == '{'
                  ? ScanSections(&values_[count_])
                  : ScanValue(&values_[count_]))) {
          return false;
        }
        members_[count_] = {id, &values_[count_]};
        ++count_;
      } else {
        for (int i = 0; i < unknown_count_; ++i) {
          if (unknown_[i] == key) return false;
        }
        if (unknown_count_ >= kMaxUnknown) return false;
        unknown_[unknown_count_++] = key;
        json::Value ignored;
        if (!ScanValue(&ignored)) return false;
      }
      SkipWhitespace();
      if (Consume(',')) continue;
      if (Consume('}')) return AtEnd();
      return false;
    }
  }

  const Member* members() const { return members_; }
  size_t count() const { return static_cast<size_t>(count_); }

 private:
  static constexpr int kMaxUnknown = 16;

  void SkipWhitespace() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool Consume(char c) {
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  bool AtEnd() {
    SkipWhitespace();
    return p_ == end_;
  }
  bool ConsumeLiteral(absl::string_view literal) {
    if (static_cast<size_t>(end_ - p_) < literal.size() ||
        absl::string_view(p_, literal.size()) != literal) {
      return false;
    }
    p_ += literal.size();
    return true;
  }

  // After the opening quote: printable ASCII without escapes, up to the closing quote.
  bool ScanPlainString(absl::string_view* out) {
    const char* start = p_;
    while (p_ != end_ && *p_ != '"') {
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '\\' || c < 0x20 || c >= 0x80) return false;
      ++p_;
    }
    if (p_ == end_) return false;
    *out = absl::string_view(start, static_cast<size_t>(p_ - start));
    ++p_;
    return true;
  }

  bool ScanValue(json::Value* out) {
    if (p_ == end_) return false;
    const char c = *p_;
    if (c == '"') {
      ++p_;
      absl::string_view s;
      if (!ScanPlainString(&s)) return false;
      *out = json::Value::String(std::string(s));
      return true;
    }
    if (c == 't') {
      *out = json::Value::Bool(true);
      return ConsumeLiteral("true");
    }
    if (c == 'f') {
      *out = json::Value::Bool(false);
      return ConsumeLiteral("false");
    }
    if (c == 'n') {
      *out = json::Value::Null();
      return ConsumeLiteral("null");
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ScanNumber(out);
    return false;  // objects, arrays, garbage: the general parser decides
  }

  // A "sections" object: plain-string names and numbers only, each name once (anything else is
  // left to the general parser, which refuses repeated names as invalid JSON).
  bool ScanSections(json::Value* out) {
    ++p_;  // '{'
    json::Value::Object members;
    SkipWhitespace();
    if (!Consume('}')) {
      while (true) {
        SkipWhitespace();
        absl::string_view key;
        if (!Consume('"') || !ScanPlainString(&key)) return false;
        for (const auto& member : members) {
          if (member.first == key) return false;
        }
        SkipWhitespace();
        if (!Consume(':')) return false;
        SkipWhitespace();
        if (p_ == end_ || !(*p_ == '-' || (*p_ >= '0' && *p_ <= '9'))) return false;
        json::Value number;
        if (!ScanNumber(&number)) return false;
        members.emplace_back(std::string(key), std::move(number));
        SkipWhitespace();
        if (Consume(',')) continue;
        if (Consume('}')) break;
        return false;
      }
    }
    *out = json::Value::MakeObject(std::move(members));
    return true;
  }

  // The RFC 8259 number grammar, converted exactly like the general parser does.
  bool ScanNumber(json::Value* out) {
    const char* start = p_;
    const bool negative = *p_ == '-';
    if (negative) ++p_;
    if (p_ == end_) return false;
    const char* digits = p_;
    if (*p_ == '0') {
      ++p_;
    } else if (*p_ >= '1' && *p_ <= '9') {
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    } else {
      return false;
    }
    const char* digits_end = p_;
    bool integral = true;
    if (p_ != end_ && *p_ == '.') {
      integral = false;
      ++p_;
      if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      integral = false;
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    if (p_ - start >= 64) return false;
    if (integral && digits_end - digits <= 18) {
      // At most 18 digits always fit in int64 and convert to double exactly as strtod would.
      int64_t magnitude = 0;
      for (const char* q = digits; q != digits_end; ++q) magnitude = magnitude * 10 + (*q - '0');
      const int64_t integer = negative ? -magnitude : magnitude;
      const double d = negative && magnitude == 0 ? -0.0 : static_cast<double>(integer);
      *out = json::Value::Number(d, /*is_integer=*/true, integer);
      return true;
    }
    if (integral) return false;  // long integers: leave the exact rules to the general parser
    double d = 0;
    const auto result = std::from_chars(start, p_, d);
    if (result.ec != std::errc() || result.ptr != p_ || !std::isfinite(d)) return false;
    *out = json::Value::Number(d, /*is_integer=*/false, 0);
    return true;
  }

  const char* p_;
  const char* const end_;
  json::Value values_[kFieldCount];
  Member members_[kFieldCount];
  int count_ = 0;
  bool seen_[kFieldCount] = {};
  absl::string_view unknown_[kMaxUnknown];
  int unknown_count_ = 0;
};

}  // namespace

namespace {

std::optional<Rejection> Parse(absl::string_view datagram, bool fast_path, v1::StepEvent* event,
                               ClientReport* report) {
  event->Clear();
  if (report != nullptr) *report = ClientReport{};
  if (datagram.size() > kMaxDatagramBytes) {
    return Reject(RejectReason::kTooLarge, absl::StrCat("datagram of ", datagram.size(),
                                                        " bytes exceeds ", kMaxDatagramBytes));
  }
  Slot slots[kFieldCount];
  FlatScanner scanner(datagram);
  if (fast_path && scanner.Scan()) {
    if (auto rejection = TakeMembers(scanner.members(), scanner.count(), slots)) return rejection;
  } else {
    // Step events are flat; a little nesting is allowed for unknown fields.
    json::ParseOptions options;
    options.max_depth = 8;
    absl::StatusOr<json::Value> parsed = json::Parse(datagram, options);
    if (!parsed.ok()) return Reject(RejectReason::kNotJson, std::string(parsed.status().message()));
    if (!parsed->is_object()) {
      return Reject(RejectReason::kNotObject, absl::StrCat("expected an object, got ",
                                                           json::Value::TypeName(parsed->type())));
    }
    std::vector<Member> members;
    for (const auto& [key, value] : parsed->as_object()) {
      const int id = FindField(key);
      if (id >= 0) members.push_back({id, &value});  // unknown fields are ignored
    }
    if (auto rejection = TakeMembers(members.data(), members.size(), slots)) return rejection;
  }
  using step_event::FieldId;
  auto number = [&](FieldId id) {
    return slots[id].present ? std::optional<double>(slots[id].number) : std::nullopt;
  };
  auto integer = [&](FieldId id) {
    return slots[id].present ? std::optional<int64_t>(slots[id].integer) : std::nullopt;
  };
  step_event::Fields fields;
  fields.job = slots[step_event::kJob].text;
  fields.rank = slots[step_event::kRank].integer;
  fields.world_size = slots[step_event::kWorldSize].integer;
  fields.step = slots[step_event::kStep].integer;
  fields.step_seconds = slots[step_event::kStepS].number;
  fields.data_seconds = number(step_event::kDataS);
  fields.compute_seconds = number(step_event::kComputeS);
  fields.comm_seconds = number(step_event::kCommS);
  fields.samples = integer(step_event::kSamples);
  fields.local_rank = integer(step_event::kLocalRank);
  fields.gpu = integer(step_event::kGpu);
  fields.dp_rank = integer(step_event::kDpRank);
  fields.pp_stage = integer(step_event::kPpStage);
  fields.tp_rank = integer(step_event::kTpRank);
  fields.sections = slots[step_event::kSections].sections;
  fields.dropped = integer(step_event::kDropped);
  if (absl::Status valid = step_event::Validate(fields); !valid.ok()) {
    return Reject(RejectReason::kOutOfRange, std::string(valid.message()));
  }

  // The rules bound every integer below to 32 bits.
  event->set_job(std::string(fields.job));
  event->set_rank(static_cast<int32_t>(fields.rank));
  event->set_world_size(static_cast<int32_t>(fields.world_size));
  event->set_step(fields.step);
  event->set_step_seconds(fields.step_seconds);
  if (fields.data_seconds) event->set_data_seconds(*fields.data_seconds);
  if (fields.compute_seconds) event->set_compute_seconds(*fields.compute_seconds);
  if (fields.comm_seconds) event->set_comm_seconds(*fields.comm_seconds);
  if (fields.samples) event->set_samples(*fields.samples);
  if (fields.local_rank) event->set_local_rank(static_cast<int32_t>(*fields.local_rank));
  if (fields.gpu) event->set_gpu(static_cast<int32_t>(*fields.gpu));
  if (fields.dp_rank) event->set_dp_rank(static_cast<int32_t>(*fields.dp_rank));
  if (fields.pp_stage) event->set_pp_stage(static_cast<int32_t>(*fields.pp_stage));
  if (fields.tp_rank) event->set_tp_rank(static_cast<int32_t>(*fields.tp_rank));
  if (!fields.sections.empty()) {
    auto& sections = *event->mutable_sections();
    for (const step_event::Section& s : fields.sections) sections[s.first] = s.second;
  }
  if (report != nullptr && fields.dropped) report->dropped = static_cast<uint64_t>(*fields.dropped);
  return std::nullopt;
}
}  // namespace

std::optional<Rejection> ParseStepEvent(absl::string_view datagram, v1::StepEvent* event,
                                        ClientReport* report) {
  return Parse(datagram, /*fast_path=*/true, event, report);
}

std::optional<Rejection> ParseStepEventWithoutFastPath(absl::string_view datagram,
                                                       v1::StepEvent* event, ClientReport* report) {
  return Parse(datagram, /*fast_path=*/false, event, report);
}

}  // namespace stepwatch::agent
