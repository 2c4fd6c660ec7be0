// The shared table of step-event edge cases (tests/data/step_event_cases.json) for the C++ tests:
// the agent parser, the rules, and the header-only client are each run over the same cases.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/step_event_rules.h"

namespace stepwatch::test {

// One field's value in a case.
struct CaseValue {
  enum class Kind { kString, kInteger, kNumber, kLiteral, kSections };
  Kind kind = Kind::kInteger;
  std::string text;  // kString: the string; kLiteral: the JSON number as written
  int64_t integer = 0;
  double number = 0;  // may be NaN or +-inf
  // kSections: name -> seconds in the case's order (values may be NaN or +-inf).
  std::vector<step_event::Section> sections;
};

struct StepEventCase {
  std::string name;
  bool accept = false;
  std::string field;  // the field a refusal names
  // Indexed by step_event::FieldId; absent fields are nullopt.
  std::optional<CaseValue> values[step_event::kFieldCount];
};

// Loads the table; fails the calling test (and returns empty) when it cannot.
std::vector<StepEventCase> LoadStepEventCases();

// The case as a datagram, fields in the rules' order (NaN and infinities written as NaN,
// Infinity, -Infinity, which are not JSON).
std::string EncodeDatagram(const StepEventCase& c);

// The case's values as plain fields; false when one does not fit (a literal over 64 bits). The
// fields may point into `c` (its sections).
bool ToFields(const StepEventCase& c, step_event::Fields* fields);

// A path under the source tree.
std::string SourcePath(const std::string& relative);

}  // namespace stepwatch::test
