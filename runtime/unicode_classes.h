// The Unicode character classes GPT-2's pre-tokenization pattern names:
// \p{L} (letters), \p{N} (numbers) and \s (White_Space), and a UTF-8 reader
// that takes any bytes. The letter and number ranges are generated from the
// Unicode Character Database by tools/gen_unicode_classes.py (Python's
// unicodedata); the generated table is runtime/unicode_classes_table.inc.
#pragma once

#include <cstddef>
#include <string_view>

namespace napkin::unicode {

bool is_letter(char32_t c);      // General_Category L* (Lu Ll Lt Lm Lo)
bool is_number(char32_t c);      // General_Category N* (Nd Nl No)
bool is_whitespace(char32_t c);  // the White_Space property (regex \s)

// A byte that does not start a well-formed UTF-8 character (a stray
// continuation byte, a truncated or overlong sequence, a surrogate) is read
// as this code point, one byte long: byte-level BPE takes any bytes, and such
// a byte is neither a letter, a number nor whitespace.
inline constexpr char32_t kInvalidByte = 0x110000;

// The character at text[i] (i < text.size()): sets `c` and returns its length
// in bytes (1 to 4).
size_t decode_utf8(std::string_view text, size_t i, char32_t& c);

}  // namespace napkin::unicode
