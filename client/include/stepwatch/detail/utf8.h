// The one UTF-8 decoder of stepwatch (RFC 3629: no overlong forms, no surrogates, nothing over
// U+10FFFF), header-only and standard library only so that the C++ client can carry it;
// common/utf8.h is the same code for the rest of stepwatch.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stepwatch::detail {

// One decoded sequence: `length` bytes (1 to 4) holding `code_point`, or length 0 when the bytes at
// that offset are not a well-formed sequence.
struct Utf8Sequence {
  size_t length = 0;
  uint32_t code_point = 0;
  // Only when length is 0: the lead byte was valid but the text ended before its last byte, which
  // the JSON parser reports apart from other malformed input.
  bool truncated = false;
};

// Decodes the sequence that starts at data[offset]; offset < size.
constexpr Utf8Sequence DecodeUtf8At(const char* data, size_t size, size_t offset) noexcept {
  Utf8Sequence result;
  const unsigned char c = static_cast<unsigned char>(data[offset]);
  if (c < 0x80) {
    result.length = 1;
    result.code_point = c;
    return result;
  }
  size_t len = 0;
  uint32_t min = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    min = 0x10000;
  } else {
    return result;
  }
  if (size - offset < len) {
    result.truncated = true;
    return result;
  }
  uint32_t cp = c & (0xFFu >> (len + 1));
  for (size_t k = 1; k < len; ++k) {
    const unsigned char cc = static_cast<unsigned char>(data[offset + k]);
    if ((cc & 0xC0) != 0x80) return result;
    cp = (cp << 6) | (cc & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return result;
  result.length = len;
  result.code_point = cp;
  return result;
}

}  // namespace stepwatch::detail
