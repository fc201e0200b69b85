#include "runtime/pretokenize.h"

#include <algorithm>

#include "runtime/unicode_classes.h"

namespace napkin::tokenizer {
namespace {

enum class CharClass { Letter, Number, Space, Other };

CharClass classify(char32_t c) {
  if (c < 0x80) {  // the common case, without the range tables
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return CharClass::Letter;
    if (c >= '0' && c <= '9') return CharClass::Number;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return CharClass::Space;
    return CharClass::Other;
  }
  if (unicode::is_letter(c)) return CharClass::Letter;
  if (unicode::is_number(c)) return CharClass::Number;
  if (unicode::is_whitespace(c)) return CharClass::Space;
  return CharClass::Other;
}

// The end of the run of characters of class `cls` that starts at text[i].
size_t run_end(std::string_view text, size_t i, CharClass cls) {
  while (i < text.size()) {
    char32_t c;
    size_t n = unicode::decode_utf8(text, i, c);
    if (classify(c) != cls) break;
    i += n;
  }
  return i;
}

// 's|'t|'re|'ve|'m|'ll|'d at text[i] (an apostrophe): the contraction's length, or 0.
size_t contraction_length(std::string_view text, size_t i) {
  if (i + 1 >= text.size()) return 0;
  switch (text[i + 1]) {
    case 's': case 't': case 'm': case 'd':
      return 2;
    case 'r':
    case 'v':
      return i + 2 < text.size() && text[i + 2] == 'e' ? 3 : 0;
    case 'l':
      return i + 2 < text.size() && text[i + 2] == 'l' ? 3 : 0;
    default:
      return 0;
  }
}

// The run of whitespace that starts at text[begin]: where it ends, where its
// last character starts, and the end of its last \r or \n (0 when none).
struct WhitespaceRun {
  size_t end, last, after_newline;
};

WhitespaceRun whitespace_run(std::string_view text, size_t begin) {
  WhitespaceRun run{begin, begin, 0};
  while (run.end < text.size()) {
    char32_t w;
    const size_t k = unicode::decode_utf8(text, run.end, w);
    if (classify(w) != CharClass::Space) break;
    if (w == '\r' || w == '\n') run.after_newline = run.end + 1;
    run.last = run.end;
    run.end += k;
  }
  return run;
}

// `\s+(?!\S)|\s+` at a run of whitespace: the run but its last character
// when a non-space follows (that character then starts the next piece, as
// the space of " word" or on its own); a run of one whole.
size_t whitespace_piece_end(std::string_view text, size_t begin, const WhitespaceRun& run) {
  return run.end == text.size() || run.last == begin ? run.end : run.last;
}

bool ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

bool ascii_non_space(char c) { return static_cast<unsigned char>(c) < 0x80 && !ascii_space(c); }

}  // namespace

size_t gpt2_piece_end(std::string_view text, size_t begin) {
  char32_t c;
  unicode::decode_utf8(text, begin, c);
  if (c == '\'') {
    if (size_t k = contraction_length(text, begin)) return begin + k;
  }
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the optional space belongs
  // to the run that follows it.
  size_t start = begin;
  CharClass cls = classify(c);
  if (c == ' ' && begin + 1 < text.size()) {
    char32_t next;
    unicode::decode_utf8(text, begin + 1, next);
    if (classify(next) != CharClass::Space) {
      start = begin + 1;
      cls = classify(next);
    }
  }
  if (cls != CharClass::Space) return run_end(text, start, cls);
  return whitespace_piece_end(text, begin, whitespace_run(text, begin));
}

size_t llama3_piece_end(std::string_view text, size_t begin) {
  char32_t c;
  const size_t n = unicode::decode_utf8(text, begin, c);
  const CharClass cls = classify(c);
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (c == '\'') {
    // ASCII letters only: `| 0x20` lowers 'A'-'Z' and moves no other byte into 'a'-'z'.
    const auto lower = [&](size_t k) { return k < text.size() ? static_cast<char>(text[k] | 0x20) : '\0'; };
    const char a = lower(begin + 1), b = lower(begin + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return begin + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return begin + 3;
    // U+017F (long s) folds to 's' under Unicode case folding, as (?i) matches it.
    if (text.substr(begin + 1, 2) == "\xc5\xbf") return begin + 3;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (cls == CharClass::Letter) return run_end(text, begin, CharClass::Letter);
  char32_t next = 0;
  const bool has_next = begin + n < text.size();
  if (has_next) unicode::decode_utf8(text, begin + n, next);
  if (cls != CharClass::Number && c != '\r' && c != '\n' && has_next && classify(next) == CharClass::Letter)
    return run_end(text, begin + n, CharClass::Letter);
  // \p{N}{1,3}
  if (cls == CharClass::Number) {
    size_t end = begin + n;
    for (int k = 1; k < 3 && end < text.size(); ++k) {
      char32_t d;
      const size_t m = unicode::decode_utf8(text, end, d);
      if (classify(d) != CharClass::Number) break;
      end += m;
    }
    return end;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  size_t start = begin;
  if (c == ' ' && has_next && classify(next) == CharClass::Other) start = begin + 1;
  if (start != begin || cls == CharClass::Other) {
    size_t end = run_end(text, start, CharClass::Other);
    while (end < text.size() && (text[end] == '\r' || text[end] == '\n')) ++end;
    return end;
  }
  // Whitespace. `\s*[\r\n]+`: through the run's last newline; else as GPT-2's.
  const WhitespaceRun run = whitespace_run(text, begin);
  return run.after_newline ? run.after_newline : whitespace_piece_end(text, begin, run);
}

bool is_safe_cut(std::string_view text, size_t pos) {
  return pos >= 1 && pos < text.size() && ascii_non_space(text[pos - 1]) && (text[pos] == ' ' || text[pos] == '\t');
}

std::vector<size_t> safe_cuts(std::string_view text, size_t parts) {
  std::vector<size_t> cuts;
  size_t pos = 1;
  for (size_t k = 1; k < parts; ++k) {
    pos = std::max(pos, text.size() / parts * k);
    while (pos < text.size() && !is_safe_cut(text, pos)) ++pos;
    if (pos >= text.size()) break;
    cuts.push_back(pos++);
  }
  return cuts;
}

}  // namespace napkin::tokenizer
