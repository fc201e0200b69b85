#include "runtime/unicode_classes.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

namespace napkin::unicode {
namespace {

struct CodeRange {
  char32_t first, last;  // inclusive
};

#include "runtime/unicode_classes_table.inc"

template <size_t N>
bool in_ranges(const CodeRange (&ranges)[N], char32_t c) {
  const CodeRange* it =
      std::upper_bound(std::begin(ranges), std::end(ranges), c, [](char32_t v, const CodeRange& r) { return v < r.first; });
  return it != std::begin(ranges) && c <= std::prev(it)->last;
}

}  // namespace

bool is_letter(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  return in_ranges(kLetterRanges, c);
}

bool is_number(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return in_ranges(kNumberRanges, c);
}

bool is_whitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= '\t' && c <= '\r');
  switch (c) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

size_t decode_utf8(std::string_view text, size_t i, char32_t& c) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) {
    c = b0;
    return 1;
  }
  // The well-formed sequences of the Unicode standard's table 3-7: the second
  // byte's range depends on the first (no overlong forms, no surrogates,
  // nothing above U+10FFFF).
  size_t length = 0;
  uint8_t low = 0x80, high = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) length = 2;
  else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) low = 0xA0;
    if (b0 == 0xED) high = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) low = 0x90;
    if (b0 == 0xF4) high = 0x8F;
  }
  if (length == 0 || i + length > text.size() || byte(i + 1) < low || byte(i + 1) > high) {
    c = kInvalidByte;
    return 1;
  }
  char32_t value = b0 & (0xFF >> (length + 1));
  for (size_t k = 1; k < length; ++k) {
    if (k > 1 && (byte(i + k) & 0xC0) != 0x80) {
      c = kInvalidByte;
      return 1;
    }
    value = (value << 6) | (byte(i + k) & 0x3F);
  }
  c = value;
  return length;
}

}  // namespace napkin::unicode
