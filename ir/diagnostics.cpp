#include "ir/diagnostics.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

namespace napkin::ir {

size_t utf8_sequence_length(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0; };
  auto tail = [](unsigned char b) { return (b & 0xC0) == 0x80; };
  unsigned char c = byte(0), c1 = byte(1);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return tail(c1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    bool second = c == 0xE0 ? c1 >= 0xA0 && c1 <= 0xBF : c == 0xED ? c1 >= 0x80 && c1 <= 0x9F : tail(c1);
    return second && tail(byte(2)) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    bool second = c == 0xF0 ? c1 >= 0x90 && c1 <= 0xBF : c == 0xF4 ? c1 >= 0x80 && c1 <= 0x8F : tail(c1);
    return second && tail(byte(2)) && tail(byte(3)) ? 4 : 0;
  }
  return 0;
}

uint32_t utf8_code_point(std::string_view s, size_t i, size_t length) {
  auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
  switch (length) {
    case 1: return b(0);
    case 2: return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3: return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    default: return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
  }
}

namespace {

// One character of text as a terminal shows it: its bytes in the text and
// what stands for it. Model text reaches messages and quoted lines, and a raw
// control byte there (ESC, a NUL, a C1 control) would drive the terminal, so
// control characters are shown escaped, as are bytes that are not UTF-8.
struct Glyph {
  size_t begin = 0;  // first byte in the text
  size_t size = 0;   // bytes in the text
  char shown[8] = {};
  size_t shown_size = 0;
  int width = 0;  // characters shown (a multi-byte character counts one)
  std::string_view text() const { return {shown, shown_size}; }
};

// Characters that move the cursor, change the terminal's state or reorder
// the text around them: C0 controls, DEL, C1 controls, and Unicode's line
// separators and bidirectional controls.
bool is_control(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0x200E || cp == 0x200F ||
         (cp >= 0x2028 && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

// The glyph at s[i]. A tab is kept as it is when `keep_tab` (a quoted line
// keeps its tabs so that the caret line can repeat them), else written \t.
Glyph glyph_at(std::string_view s, size_t i, bool keep_tab) {
  Glyph g;
  g.begin = i;
  size_t length = utf8_sequence_length(s, i);
  auto show = [&](std::string_view text, int width) {
    std::copy(text.begin(), text.end(), g.shown);
    g.shown_size = text.size();
    g.width = width;
  };
  if (length == 0) {  // not UTF-8: the byte in hex
    g.size = 1;
    std::string hex = fmt::format("\\x{:02x}", static_cast<unsigned char>(s[i]));
    show(hex, static_cast<int>(hex.size()));
    return g;
  }
  g.size = length;
  uint32_t cp = utf8_code_point(s, i, length);
  if (cp == '\t' && keep_tab) {
    show("\t", 1);
  } else if (is_control(cp)) {
    std::string escaped = cp == '\t' ? "\\t" : cp == '\n' ? "\\n" : cp == '\r' ? "\\r"
                        : cp < 0x80  ? fmt::format("\\x{:02x}", cp)
                                     : fmt::format("\\u{:04x}", cp);
    show(escaped, static_cast<int>(escaped.size()));
  } else {
    show(s.substr(i, length), 1);
  }
  return g;
}

// `text` with every control character and non-UTF-8 byte escaped.
std::string visible(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    Glyph g = glyph_at(text, i, false);
    out += g.text();
    i += g.size;
  }
  return out;
}

// A message or hint is a sentence, but it may quote a name of any length
// from the model: past this many characters its middle is left out.
constexpr size_t kMaxMessageChars = 1000;

std::string visible_message(std::string_view text) {
  size_t count = 0;
  for (size_t i = 0; i < text.size(); ++count) i += glyph_at(text, i, false).size;
  if (count <= kMaxMessageChars) return visible(text);
  const size_t head = kMaxMessageChars * 4 / 5, tail = kMaxMessageChars / 5;
  std::string out;
  size_t k = 0;
  for (size_t i = 0; i < text.size(); ++k) {
    Glyph g = glyph_at(text, i, false);
    if (k < head || k >= count - tail) out += g.text();
    if (k == head) out += fmt::format(" ... ({} characters left out) ... ", count - head - tail);
    i += g.size;
  }
  return out;
}

// How much of a source line a diagnostic quotes: a longer line is shown as a
// window around the column, with "..." where it is cut.
constexpr int kMaxQuotedWidth = 160;

// The quoted line and the caret line under it (empty if col is 0) for the
// 1-based byte column `col` of `line`.
std::pair<std::string, std::string> quote_line(std::string_view line, int col) {
  // A glyph is at most 4 bytes and shows at least 1 character, so the window
  // lies within 4 * kMaxQuotedWidth bytes of the column: decode only those.
  const size_t at = std::min(col > 0 ? static_cast<size_t>(col - 1) : 0, line.size());
  const size_t reach = 4 * kMaxQuotedWidth;
  size_t first = at > reach ? at - reach : 0, last = std::min(line.size(), at + reach);
  while (first > 0 && first < at && (static_cast<unsigned char>(line[first]) & 0xC0) == 0x80) ++first;
  std::vector<Glyph> glyphs;
  for (size_t i = first; i < last;) {
    glyphs.push_back(glyph_at(line, i, true));
    i += glyphs.back().size;
  }
  // The glyph under the caret: the one holding byte `at` (glyphs.size() past the end).
  size_t caret = 0;
  while (caret < glyphs.size() && glyphs[caret].begin + glyphs[caret].size <= at) ++caret;

  // Grow the window from the caret: up to half the width to the left, then
  // to the right, then whatever is left to the left.
  size_t lo = caret, hi = std::min(caret + 1, glyphs.size());
  int used = hi > lo ? glyphs[lo].width : 1;
  while (lo > 0 && used + glyphs[lo - 1].width <= kMaxQuotedWidth / 2) used += glyphs[--lo].width;
  while (hi < glyphs.size() && used + glyphs[hi].width <= kMaxQuotedWidth) used += glyphs[hi++].width;
  while (lo > 0 && used + glyphs[lo - 1].width <= kMaxQuotedWidth) used += glyphs[--lo].width;

  const bool cut_left = lo > 0 || first > 0, cut_right = hi < glyphs.size() || last < line.size();
  std::string quoted = cut_left ? "..." : "", pad = cut_left ? "   " : "";
  for (size_t k = lo; k < hi; ++k) quoted += glyphs[k].text();
  if (cut_right) quoted += "...";
  if (col <= 0) return {quoted, ""};
  // Tabs stay tabs in the caret line so the caret lines up under tab-indented text.
  for (size_t k = lo; k < caret; ++k) pad += glyphs[k].text() == "\t" ? "\t" : std::string(glyphs[k].width, ' ');
  return {quoted, pad + "^"};
}

}  // namespace

SourceLoc SourceLoc::shifted(int chars) const {
  SourceLoc moved = *this;
  if (moved.col > 0) moved.col += chars;
  return moved;
}

void Diagnostics::add_source(const std::string& file, std::string text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  source_lines_[file] = std::move(lines);
}

const std::vector<std::string>* Diagnostics::source_lines(const std::string& file) const {
  auto it = source_lines_.find(file);
  return it == source_lines_.end() ? nullptr : &it->second;
}

void Diagnostics::error(const SourceLoc& loc, std::string message, std::string hint) {
  diagnostics_.push_back({Severity::Error, loc, std::move(message), std::move(hint)});
  ++error_count_;
}

void Diagnostics::warning(const SourceLoc& loc, std::string message, std::string hint) {
  diagnostics_.push_back({Severity::Warning, loc, std::move(message), std::move(hint)});
}

static const char* severity_word(Severity s) {
  switch (s) {
    case Severity::Error: return "error";
    case Severity::Warning: return "warning";
  }
  return "error";
}

std::string Diagnostics::render_one(const Diagnostic& d) const {
  std::string out;
  if (d.loc.known()) {
    out += fmt::format("{}:{}:", visible(*d.loc.file), d.loc.line);
    if (d.loc.col > 0) out += fmt::format("{}:", d.loc.col);
    out += " ";
  } else if (d.loc.file) {
    out += visible(*d.loc.file) + ": ";
  }
  out += fmt::format("{}: {}\n", severity_word(d.severity), visible_message(d.message));
  if (d.loc.known()) {
    auto it = source_lines_.find(*d.loc.file);
    if (it != source_lines_.end() && d.loc.line <= static_cast<int>(it->second.size())) {
      auto [quoted, caret] = quote_line(it->second[d.loc.line - 1], d.loc.col);
      out += "    " + quoted + "\n";
      if (!caret.empty()) out += "    " + caret + "\n";
    }
  }
  if (!d.hint.empty()) out += "    hint: " + visible_message(d.hint) + "\n";
  return out;
}

std::string Diagnostics::render() const {
  std::vector<const Diagnostic*> order;
  for (const auto& d : diagnostics_) order.push_back(&d);
  std::stable_sort(order.begin(), order.end(), [](const Diagnostic* a, const Diagnostic* b) {
    std::string fa = a->loc.file ? *a->loc.file : "", fb = b->loc.file ? *b->loc.file : "";
    if (fa != fb) return fa < fb;
    if (a->loc.line != b->loc.line) return a->loc.line < b->loc.line;
    return a->loc.col < b->loc.col;
  });
  std::string out;
  for (const Diagnostic* d : order) out += render_one(*d);
  if (error_count_ > 0)
    out += fmt::format("{} error{} generated.\n", error_count_, error_count_ == 1 ? "" : "s");
  return out;
}

}  // namespace napkin::ir
