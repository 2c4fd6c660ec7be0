// The one UTF-8 decoder and encoder of the JSON parser, the step-event rules and the terminal text
// escaper (RFC 3629: no overlong forms, no surrogates, nothing over U+10FFFF).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace stepwatch {

// One decoded sequence: `length` bytes (1 to 4) holding `code_point`, or length 0 when the bytes at
// that offset are not a well-formed sequence.
struct Utf8Sequence {
  size_t length = 0;
  uint32_t code_point = 0;
  // Only when length is 0: the lead byte was valid but the text ended before its last byte, which
  // the JSON parser reports apart from other malformed input.
  bool truncated = false;
};

// Decodes the sequence that starts at text[offset]; offset < text.size().
Utf8Sequence DecodeUtf8At(absl::string_view text, size_t offset);

// Appends the encoding of `code_point` (at most U+10FFFF, not a surrogate) to `out`.
void AppendUtf8(uint32_t code_point, std::string* out);

}  // namespace stepwatch
