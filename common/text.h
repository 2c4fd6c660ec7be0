// Text that reaches a terminal. Job names, node names and summaries come from senders; printed
// raw, an escape sequence in one could rewrite the operator's screen.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace stepwatch {

// `text` with every control character except newline and tab shown as a visible escape ("\x1b"):
// C0 controls, DEL and the C1 controls U+0080..U+009F (UTF-8 0xC2 0x80..0x9F).
std::string EscapeControlCharacters(absl::string_view text);

// Offset of the first control character (as above, newline and tab included), or npos.
size_t FindControlCharacter(absl::string_view text);

}  // namespace stepwatch
