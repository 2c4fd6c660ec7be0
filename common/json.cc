#include "common/json.h"

#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "stepwatch/detail/client_json.h"

namespace stepwatch::json {

Value Value::Bool(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}

Value Value::Number(double d, bool is_integer, int64_t integer) {
  Value v;
  v.type_ = Type::kNumber;
  v.number_ = d;
  v.is_integer_ = is_integer;
  v.integer_ = integer;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.type_ = Type::kString;
  v.string_ = std::move(s);
  return v;
}

Value Value::MakeArray(Array a) {
  Value v;
  v.type_ = Type::kArray;
  v.array_ = std::make_shared<Array>(std::move(a));
  return v;
}

Value Value::MakeObject(Object o) {
  Value v;
  v.type_ = Type::kObject;
  v.object_ = std::make_shared<Object>(std::move(o));
  return v;
}

const Value* Value::Find(absl::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& [k, v] : *object_) {
    if (k == key) return &v;
  }
  return nullptr;
}

const char* Value::TypeName(Type t) {
  switch (t) {
    case Type::kNull:
      return "null";
    case Type::kBool:
      return "bool";
    case Type::kNumber:
      return "number";
    case Type::kString:
      return "string";
    case Type::kArray:
      return "array";
    case Type::kObject:
      return "object";
  }
  return "unknown";
}

namespace {

class Parser {
 public:
  Parser(absl::string_view text, const ParseOptions& options)
      : p_(text.data()), end_(text.data() + text.size()), begin_(text.data()), options_(options) {}

  absl::StatusOr<Value> ParseDocument() {
    SkipWhitespace();
    Value v;
    if (!ParseValue(0, &v)) return Error();
    SkipWhitespace();
    if (p_ != end_) {
      error_ = "unexpected data after the value";
      return Error();
    }
    return v;
  }

 private:
  absl::Status Error() const {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON at offset ", p_ - begin_, ": ", error_));
  }

  bool Fail(const char* message) {
    error_ = message;
    return false;
  }

  void SkipWhitespace() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }

  bool ConsumeLiteral(const char* literal) {
    size_t n = std::strlen(literal);
    if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, literal, n) != 0) {
      return Fail("invalid literal");
    }
    p_ += n;
    return true;
  }

  bool ParseValue(int depth, Value* out) {
    if (p_ == end_) return Fail("unexpected end of input");
    switch (*p_) {
      case '{':
        return ParseObject(depth, out);
      case '[':
        return ParseArray(depth, out);
      case '"': {
        std::string s;
        if (!ParseString(&s)) return false;
        *out = Value::String(std::move(s));
        return true;
      }
      case 't':
        if (!ConsumeLiteral("true")) return false;
        *out = Value::Bool(true);
        return true;
      case 'f':
        if (!ConsumeLiteral("false")) return false;
        *out = Value::Bool(false);
        return true;
      case 'n':
        if (!ConsumeLiteral("null")) return false;
        *out = Value::Null();
        return true;
      default:
        if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) return ParseNumber(out);
        return Fail("unexpected character");
    }
  }

  bool ParseObject(int depth, Value* out) {
    if (depth >= options_.max_depth) return Fail("nesting too deep");
    ++p_;  // '{'
    Value::Object members;
    SkipWhitespace();
    if (p_ != end_ && *p_ == '}') {
      ++p_;
      *out = Value::MakeObject(std::move(members));
      return true;
    }
    while (true) {
      SkipWhitespace();
      if (p_ == end_ || *p_ != '"') return Fail("expected a string key");
      std::string key;
      if (!ParseString(&key)) return false;
      for (const auto& member : members) {
        if (member.first == key) return Fail("duplicate key");
      }
      SkipWhitespace();
      if (p_ == end_ || *p_ != ':') return Fail("expected ':'");
      ++p_;
      SkipWhitespace();
      Value v;
      if (!ParseValue(depth + 1, &v)) return false;
      members.emplace_back(std::move(key), std::move(v));
      SkipWhitespace();
      if (p_ == end_) return Fail("unterminated object");
      if (*p_ == ',') {
        ++p_;
        continue;
      }
      if (*p_ == '}') {
        ++p_;
        *out = Value::MakeObject(std::move(members));
        return true;
      }
      return Fail("expected ',' or '}'");
    }
  }

  bool ParseArray(int depth, Value* out) {
    if (depth >= options_.max_depth) return Fail("nesting too deep");
    ++p_;  // '['
    Value::Array items;
    SkipWhitespace();
    if (p_ != end_ && *p_ == ']') {
      ++p_;
      *out = Value::MakeArray(std::move(items));
      return true;
    }
    while (true) {
      SkipWhitespace();
      Value v;
      if (!ParseValue(depth + 1, &v)) return false;
      items.push_back(std::move(v));
      SkipWhitespace();
      if (p_ == end_) return Fail("unterminated array");
      if (*p_ == ',') {
        ++p_;
        continue;
      }
      if (*p_ == ']') {
        ++p_;
        *out = Value::MakeArray(std::move(items));
        return true;
      }
      return Fail("expected ',' or ']'");
    }
  }

  static int HexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  bool ParseHex4(uint32_t* out) {
    if (end_ - p_ < 4) return Fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      int d = HexDigit(p_[i]);
      if (d < 0) return Fail("invalid \\u escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    p_ += 4;
    *out = v;
    return true;
  }

  // Validates one UTF-8 sequence starting at p_ and copies it.
  bool CopyUtf8(std::string* out) {
    const Utf8Sequence seq = DecodeUtf8At(absl::string_view(p_, end_ - p_), 0);
    if (seq.truncated) return Fail("truncated UTF-8");
    if (seq.length == 0) return Fail("invalid UTF-8");
    out->append(p_, seq.length);
    p_ += seq.length;
    return true;
  }

  bool ParseString(std::string* out) {
    ++p_;  // opening quote
    while (true) {
      // Copy the run of plain characters at once.
      const char* run = p_;
      while (p_ != end_ && *p_ != '"' && *p_ != '\\' && static_cast<unsigned char>(*p_) >= 0x20 &&
             static_cast<unsigned char>(*p_) < 0x80) {
        ++p_;
      }
      out->append(run, p_ - run);
      if (p_ == end_) return Fail("unterminated string");
      char c = *p_;
      if (c == '"') {
        ++p_;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return Fail("control character in string");
      if (static_cast<unsigned char>(c) >= 0x80) {
        if (!CopyUtf8(out)) return false;
        continue;
      }
      // Backslash escape.
      ++p_;
      if (p_ == end_) return Fail("unterminated escape");
      char e = *p_++;
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp;
          if (!ParseHex4(&cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low;
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return Fail("lone surrogate");
            p_ += 2;
            if (!ParseHex4(&low)) return false;
            if (low < 0xDC00 || low > 0xDFFF) return Fail("invalid surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Fail("lone surrogate");
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return Fail("invalid escape");
      }
    }
  }

  bool ParseNumber(Value* out) {
    const char* start = p_;
    bool negative = false;
    if (*p_ == '-') {
      negative = true;
      ++p_;
    }
    if (p_ == end_) return Fail("truncated number");
    if (*p_ == '0') {
      ++p_;
    } else if (*p_ >= '1' && *p_ <= '9') {
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    } else {
      return Fail("invalid number");
    }
    bool integral = true;
    if (p_ != end_ && *p_ == '.') {
      integral = false;
      ++p_;
      if (p_ == end_ || *p_ < '0' || *p_ > '9') return Fail("invalid number");
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      integral = false;
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || *p_ < '0' || *p_ > '9') return Fail("invalid number");
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    const size_t len = static_cast<size_t>(p_ - start);
    if (len >= 64) return Fail("number too long");
    // Not strtod: it reads the decimal point of the process locale (LC_NUMERIC), so "0.25" would
    // stop at the '.' under a comma-decimal locale. SimpleAtod ignores the locale; like strtod it
    // gives infinity on overflow (refused below) and 0 on underflow.
    double d = 0;
    if (!absl::SimpleAtod(absl::string_view(start, len), &d)) return Fail("invalid number");
    if (!std::isfinite(d)) return Fail("number out of range");
    int64_t integer = 0;
    bool is_int = false;
    if (integral) {
      // Accumulate exactly; reject overflow rather than round.
      uint64_t magnitude = 0;
      bool overflow = false;
      for (const char* q = start + (negative ? 1 : 0); q != p_; ++q) {
        uint64_t digit = static_cast<uint64_t>(*q - '0');
        if (magnitude > (UINT64_MAX - digit) / 10) {
          overflow = true;
          break;
        }
        magnitude = magnitude * 10 + digit;
      }
      const uint64_t limit = negative ? (uint64_t{1} << 63) : (uint64_t{1} << 63) - 1;
      if (!overflow && magnitude <= limit) {
        is_int = true;
        integer = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
      }
    }
    *out = Value::Number(d, is_int, integer);
    return true;
  }

  const char* p_;
  const char* end_;
  const char* begin_;
  const ParseOptions& options_;
  const char* error_ = "";
};

}  // namespace

absl::StatusOr<Value> Parse(absl::string_view text, const ParseOptions& options) {
  return Parser(text, options).ParseDocument();
}

void AppendQuoted(absl::string_view s, std::string* out) {
  // The one JSON string writer, shared with the header-only client.
  client_internal::AppendJsonString(std::string_view(s.data(), s.size()), out);
}

std::string Quote(absl::string_view s) {
  std::string out;
  AppendQuoted(s, &out);
  return out;
}

}  // namespace stepwatch::json
