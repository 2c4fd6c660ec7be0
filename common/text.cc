#include "common/text.h"

#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/utf8.h"

namespace stepwatch {

namespace {

// Length of the control character at text[i] (1 or 2 bytes), 0 when there is none. Bytes that
// are not UTF-8 are no control characters; the scan goes on at the next byte.
size_t ControlAt(absl::string_view text, size_t i) {
  const unsigned char c = static_cast<unsigned char>(text[i]);
  if (c < 0x20 || c == 0x7F) return 1;
  if (c < 0x80) return 0;
  // A C1 control is the two-byte sequence 0xC2 0x80..0x9F.
  const Utf8Sequence seq = DecodeUtf8At(text, i);
  return seq.length == 2 && seq.code_point <= 0x9F ? 2 : 0;
}

}  // namespace

size_t FindControlCharacter(absl::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (ControlAt(text, i) > 0) return i;
  }
  return absl::string_view::npos;
}

std::string EscapeControlCharacters(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const size_t control = c == '\n' || c == '\t' ? 0 : ControlAt(text, i);
    if (control == 1) {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    } else if (control == 2) {
      SW_DCHECK(i + 1 < text.size());  // ControlAt saw both bytes
      absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(text[i + 1]));
      ++i;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

}  // namespace stepwatch
