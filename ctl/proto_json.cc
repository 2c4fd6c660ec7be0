#include "ctl/proto_json.h"

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"

namespace stepwatch::ctl {

namespace {

// Proto3 JSON prints 64-bit integers as strings ("last_step": "120"); `report --json` prints
// numbers, and so should every --json. This rewrites the printer's output, guided by the message's
// descriptor, so that 64-bit integer fields (alone, repeated) are numbers; all else is copied.
class Int64Unquoter {
 public:
  explicit Int64Unquoter(const std::string& in) : in_(in) {}

  std::string Run(const google::protobuf::Descriptor* top) {
    Space();
    if (Peek() == '{') Object(top);
    out_.append(in_, pos_, std::string::npos);
    return std::move(out_);
  }

 private:
  using Field = google::protobuf::FieldDescriptor;

  static bool Is64BitInteger(const Field* f) {
    switch (f->cpp_type()) {
      case Field::CPPTYPE_INT64:
      case Field::CPPTYPE_UINT64:
        return true;
      default:
        return false;
    }
  }

  char Peek() const { return pos_ < in_.size() ? in_[pos_] : '\0'; }
  void Copy() { out_ += in_[pos_++]; }
  void Space() {
    while (pos_ < in_.size() &&
           (in_[pos_] == ' ' || in_[pos_] == '\n' || in_[pos_] == '\t' || in_[pos_] == '\r')) {
      Copy();
    }
  }
  // A string token, quotes included, escapes kept.
  std::string Token() {
    const size_t start = pos_++;
    while (pos_ < in_.size() && in_[pos_] != '"') pos_ += in_[pos_] == '\\' ? 2 : 1;
    ++pos_;
    return in_.substr(start, std::min(pos_, in_.size()) - start);
  }
  static bool IsInteger(const std::string& token) {
    size_t i = 1 + (token.size() > 2 && token[1] == '-');
    if (token.size() < 3 || i >= token.size() - 1) return false;
    for (; i < token.size() - 1; ++i) {
      if (token[i] < '0' || token[i] > '9') return false;
    }
    return true;
  }

  // One value of `field` (nullptr: unknown, copied); `element`: inside its array or map.
  void Value(const Field* field, bool element) {
    Space();
    const char c = Peek();
    if (c == '{') {
      if (field != nullptr && field->is_map() && !element) {
        Object(nullptr, field->message_type()->map_value());
      } else {
        Object(field != nullptr && field->message_type() != nullptr ? field->message_type()
                                                                    : nullptr);
      }
    } else if (c == '[') {
      Copy();
      for (Space(); Peek() != ']' && pos_ < in_.size(); Space()) {
        Value(field, true);
        Space();
        if (Peek() == ',') Copy();
      }
      if (pos_ < in_.size()) Copy();
    } else if (c == '"') {
      const std::string token = Token();
      if (field != nullptr && Is64BitInteger(field) && !field->is_map() && IsInteger(token)) {
        out_.append(token, 1, token.size() - 2);
      } else {
        out_ += token;
      }
    } else {
      while (pos_ < in_.size() && !absl::StrContains(",]} \n\t\r", Peek())) {
        Copy();
      }
    }
  }

  // An object: a message's fields, or (every_value) a map's entries.
  void Object(const google::protobuf::Descriptor* message, const Field* every_value = nullptr) {
    Copy();  // {
    for (Space(); Peek() != '}' && pos_ < in_.size(); Space()) {
      const std::string key = Token();
      out_ += key;
      const Field* field = every_value;
      if (field == nullptr && message != nullptr && key.size() >= 2) {
        const std::string name = key.substr(1, key.size() - 2);
        // preserve_proto_field_names: keys are the .proto names.
        field = message->FindFieldByName(name);
      }
      Space();
      if (Peek() == ':') Copy();
      Value(field, every_value != nullptr);
      Space();
      if (Peek() == ',') Copy();
    }
    if (pos_ < in_.size()) Copy();  // }
  }

  const std::string& in_;
  size_t pos_ = 0;
  std::string out_;
};

}  // namespace

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  auto st = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!st.ok()) return absl::InternalError(std::string(st.message()));
  return Int64Unquoter(out).Run(message.GetDescriptor());
}

}  // namespace stepwatch::ctl
