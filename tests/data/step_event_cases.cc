#include "tests/data/step_event_cases.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "common/file.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::test {
namespace {

// A number in the case file's notation: a JSON number or "nan", "inf", "-inf".
bool ParseNumber(const json::Value& v, double* out) {
  if (v.is_string()) {
    const std::string& s = v.as_string();
    const double inf = std::numeric_limits<double>::infinity();
    if (s == "nan")
      *out = std::nan("");
    else if (s == "inf")
      *out = inf;
    else if (s == "-inf")
      *out = -inf;
    else
      return false;
    return true;
  }
  if (!v.is_number()) return false;
  *out = v.as_double();
  return true;
}

// Fills `out` from the case file's notation (see its "doc").
bool ParseValue(const step_event::FieldRule& rule, const json::Value& v, CaseValue* out) {
  if (rule.type == step_event::FieldType::kSections) {
    // An object of name -> number, as sent.
    if (!v.is_object()) return false;
    out->kind = CaseValue::Kind::kSections;
    for (const auto& [name, member] : v.as_object()) {
      double seconds = 0;
      if (!ParseNumber(member, &seconds)) return false;
      out->sections.emplace_back(name, seconds);
    }
    return true;
  }
  if (v.is_object()) {
    const json::Value* repeat = nullptr;
    const json::Value* times = nullptr;
    const json::Value* literal = nullptr;
    for (const auto& [key, member] : v.as_object()) {
      if (key == "repeat") repeat = &member;
      if (key == "times") times = &member;
      if (key == "literal") literal = &member;
    }
    if (literal != nullptr && literal->is_string()) {
      out->kind = CaseValue::Kind::kLiteral;
      out->text = literal->as_string();
      return true;
    }
    if (repeat == nullptr || times == nullptr || !repeat->is_string() || !times->is_integer()) {
      return false;
    }
    out->kind = CaseValue::Kind::kString;
    for (int64_t i = 0; i < times->as_int64(); ++i) out->text += repeat->as_string();
    return true;
  }
  if (rule.type == step_event::FieldType::kString) {
    if (!v.is_string()) return false;
    out->kind = CaseValue::Kind::kString;
    out->text = v.as_string();
    return true;
  }
  if (rule.type == step_event::FieldType::kNumber) {
    out->kind = CaseValue::Kind::kNumber;
    return ParseNumber(v, &out->number);
  }
  if (!v.is_number()) return false;
  if (!v.is_integer()) {
    // Over 64 bits: kept as written.
    out->kind = CaseValue::Kind::kLiteral;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.0f", v.as_double());
    out->text = buf;
    return true;
  }
  out->kind = CaseValue::Kind::kInteger;
  out->integer = v.as_int64();
  return true;
}

const json::Value* Member(const json::Value& object, const std::string& name) {
  if (!object.is_object()) return nullptr;
  for (const auto& [key, value] : object.as_object()) {
    if (key == name) return &value;
  }
  return nullptr;
}

void AppendNumber(double d, std::string* out) {
  if (std::isnan(d)) {
    out->append("NaN");
  } else if (std::isinf(d)) {
    out->append(d > 0 ? "Infinity" : "-Infinity");
  } else {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", d);
    out->append(buf);
  }
}

}  // namespace

std::string SourcePath(const std::string& relative) {
  return std::string(STEPWATCH_SOURCE_DIR) + "/" + relative;
}

std::vector<StepEventCase> LoadStepEventCases() {
  absl::StatusOr<std::string> text = ReadFile(SourcePath("tests/data/step_event_cases.json"));
  EXPECT_OK(text);
  if (!text.ok()) return {};
  absl::StatusOr<json::Value> doc = json::Parse(*text);
  EXPECT_OK(doc);
  if (!doc.ok()) return {};
  const json::Value* base = Member(*doc, "base");
  const json::Value* cases = Member(*doc, "cases");
  EXPECT_TRUE(base != nullptr && cases != nullptr && cases->is_array());
  if (base == nullptr || cases == nullptr || !cases->is_array()) return {};
  std::vector<StepEventCase> out;
  for (const json::Value& c : cases->as_array()) {
    StepEventCase parsed;
    const json::Value* name = Member(c, "name");
    const json::Value* accept = Member(c, "accept");
    const json::Value* set = Member(c, "set");
    const json::Value* field = Member(c, "field");
    EXPECT_TRUE(name && name->is_string() && accept && accept->is_bool() && set) << "bad case";
    if (!(name && name->is_string() && accept && accept->is_bool() && set)) return {};
    parsed.name = name->as_string();
    parsed.accept = accept->as_bool();
    if (field != nullptr && field->is_string()) parsed.field = field->as_string();
    for (int id = 0; id < step_event::kFieldCount; ++id) {
      const step_event::FieldRule& rule = step_event::kFieldRules[id];
      const json::Value* v = Member(*set, rule.name);
      if (v == nullptr) v = Member(*base, rule.name);
      if (v == nullptr || v->is_null()) continue;
      CaseValue value;
      EXPECT_TRUE(ParseValue(rule, *v, &value)) << parsed.name << ": " << rule.name;
      parsed.values[id] = value;
    }
    out.push_back(std::move(parsed));
  }
  return out;
}

std::string EncodeDatagram(const StepEventCase& c) {
  std::string out = "{";
  for (int id = 0; id < step_event::kFieldCount; ++id) {
    if (!c.values[id]) continue;
    const CaseValue& v = *c.values[id];
    if (out.size() > 1) out.push_back(',');
    json::AppendQuoted(step_event::kFieldRules[id].name, &out);
    out.push_back(':');
    switch (v.kind) {
      case CaseValue::Kind::kString:
        json::AppendQuoted(v.text, &out);
        break;
      case CaseValue::Kind::kInteger:
        out.append(std::to_string(v.integer));
        break;
      case CaseValue::Kind::kNumber:
        AppendNumber(v.number, &out);
        break;
      case CaseValue::Kind::kLiteral:
        out.append(v.text);
        break;
      case CaseValue::Kind::kSections:
        out.push_back('{');
        for (size_t i = 0; i < v.sections.size(); ++i) {
          if (i > 0) out.push_back(',');
          json::AppendQuoted(v.sections[i].first, &out);
          out.push_back(':');
          AppendNumber(v.sections[i].second, &out);
        }
        out.push_back('}');
        break;
    }
  }
  out.push_back('}');
  return out;
}

bool ToFields(const StepEventCase& c, step_event::Fields* f) {
  int64_t integers[step_event::kFieldCount] = {};
  double numbers[step_event::kFieldCount] = {};
  for (int id = 0; id < step_event::kFieldCount; ++id) {
    if (!c.values[id]) continue;
    const CaseValue& v = *c.values[id];
    if (v.kind == CaseValue::Kind::kLiteral) {
      const char* end = v.text.data() + v.text.size();
      auto [ptr, ec] = std::from_chars(v.text.data(), end, integers[id]);
      if (ec != std::errc() || ptr != end) return false;
    } else {
      integers[id] = v.integer;
      numbers[id] = v.number;
    }
  }
  auto integer = [&](int id) {
    return c.values[id] ? std::optional<int64_t>(integers[id]) : std::nullopt;
  };
  auto number = [&](int id) {
    return c.values[id] ? std::optional<double>(numbers[id]) : std::nullopt;
  };
  using namespace step_event;  // NOLINT: the FieldId names
  *f = Fields{};
  if (c.values[kJob]) f->job = c.values[kJob]->text;
  f->rank = integers[kRank];
  f->world_size = integers[kWorldSize];
  f->step = integers[kStep];
  f->step_seconds = numbers[kStepS];
  f->data_seconds = number(kDataS);
  f->compute_seconds = number(kComputeS);
  f->comm_seconds = number(kCommS);
  f->samples = integer(kSamples);
  f->local_rank = integer(kLocalRank);
  f->gpu = integer(kGpu);
  f->dp_rank = integer(kDpRank);
  f->pp_stage = integer(kPpStage);
  f->tp_rank = integer(kTpRank);
  if (c.values[kSections]) f->sections = c.values[kSections]->sections;
  f->dropped = integer(kDropped);
  return true;
}

}  // namespace stepwatch::test
