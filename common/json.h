// A small strict JSON (RFC 8259) reader and writer helpers. Used for the step-event datagram, the
// fake NVML state file and scenario files; nothing here allocates per character.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/check.h"

namespace stepwatch::json {

class Value {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<Value>;
  // Insertion order is kept; duplicate keys are rejected by the parser.
  using Object = std::vector<std::pair<std::string, Value>>;

  Value() = default;
  static Value Null() { return Value(); }
  static Value Bool(bool b);
  static Value Number(double d, bool is_integer, int64_t integer);
  static Value String(std::string s);
  static Value MakeArray(Array a);
  static Value MakeObject(Object o);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  bool as_bool() const { return bool_; }
  double as_double() const { return number_; }
  // True when the literal had no fraction or exponent and fits in int64.
  bool is_integer() const { return is_integer_; }
  int64_t as_int64() const { return integer_; }
  const std::string& as_string() const { return string_; }
  // Only on an array (an object): callers check the type first, so a mismatch is a bug here.
  const Array& as_array() const {
    SW_CHECK(array_ != nullptr) << "as_array() on a " << TypeName(type_);
    return *array_;
  }
  const Object& as_object() const {
    SW_CHECK(object_ != nullptr) << "as_object() on a " << TypeName(type_);
    return *object_;
  }

  // Object member lookup; nullptr when absent or when this is not an object.
  const Value* Find(absl::string_view key) const;

  static const char* TypeName(Type t);

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  bool is_integer_ = false;
  double number_ = 0;
  int64_t integer_ = 0;
  std::string string_;
  std::shared_ptr<Array> array_;
  std::shared_ptr<Object> object_;
};

struct ParseOptions {
  int max_depth = 32;
};

// Parses exactly one JSON value (surrounding whitespace allowed). NaN/Infinity literals, comments,
// trailing commas, invalid UTF-8 escapes and duplicate object keys are errors.
absl::StatusOr<Value> Parse(absl::string_view text, const ParseOptions& options = {});

// Appends `s` as a quoted JSON string to `out`.
void AppendQuoted(absl::string_view s, std::string* out);
std::string Quote(absl::string_view s);

}  // namespace stepwatch::json
