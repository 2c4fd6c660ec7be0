// The one UTF-8 decoder and encoder of the JSON parser, the step-event rules, the terminal text
// escaper and the C++ client (RFC 3629: no overlong forms, no surrogates, nothing over U+10FFFF).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "stepwatch/detail/utf8.h"

namespace stepwatch {

// The decoder is header-only so that the C++ client (client/include/stepwatch/client.h) shares it:
// one decoded sequence, `length` 0 when malformed (stepwatch/detail/utf8.h).
using Utf8Sequence = detail::Utf8Sequence;

// Decodes the sequence that starts at text[offset]; offset < text.size().
Utf8Sequence DecodeUtf8At(absl::string_view text, size_t offset);

// Appends the encoding of `code_point` (at most U+10FFFF, not a surrogate) to `out`.
void AppendUtf8(uint32_t code_point, std::string* out);

}  // namespace stepwatch
