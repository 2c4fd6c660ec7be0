// stepwatch C++ client: the JSON it writes (a string literal, a bounded writer of the event into a
// caller's buffer). Numbers go through std::to_chars, which ignores the process locale, so a
// comma-decimal LC_NUMERIC cannot change what the agent reads.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>

namespace stepwatch::client_internal {

// Appends `s` as a JSON string literal.
inline void AppendJsonString(std::string_view s, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\r':
        out->append("\\r");
        break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0xf]);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

// Bounded writer into a caller's buffer; `ok` turns false once something did not fit.
struct Writer {
  char* p;
  char* end;
  bool ok = true;

  void Raw(const char* s, size_t n) noexcept {
    if (!ok || static_cast<size_t>(end - p) < n) {
      ok = false;
      return;
    }
    std::memcpy(p, s, n);
    p += n;
  }
  template <size_t N>
  void Lit(const char (&s)[N]) noexcept {
    Raw(s, N - 1);
  }
  void Int(int64_t v) noexcept {
    if (!ok) return;
    auto r = std::to_chars(p, end, v);
    if (r.ec != std::errc()) {
      ok = false;
      return;
    }
    p = r.ptr;
  }
  // Shortest round-trip form ("0.25", "1e-05"): valid JSON for finite values.
  void Double(double v) noexcept {
    if (!ok) return;
    auto r = std::to_chars(p, end, v);
    if (r.ec != std::errc()) {
      ok = false;
      return;
    }
    p = r.ptr;
  }
};

}  // namespace stepwatch::client_internal
