// Parser for einops-style patterns ("b s (three h d) -> three b h s d").
//
// Decisions the header leaves open:
// - Whitespace (spaces, tabs, newlines) separates axes; parentheses and commas need
//   none, so "(a b)c" is two axes.
// - The output may be empty: a scalar result, as in "i, i ->" or "b s d ->".
// - An input operand may not be empty ("operand 2 has no axes"): an empty operand is
//   almost always a stray comma, and scalars enter napkin graphs through arithmetic,
//   not patterns.
// - "()" is a group with no names (a size-one axis, like "1"). "1" inside a group is
//   an error: a group lists named axes.
// - "1" is the only number allowed; "2" or "01" is an error. Names start with a
//   letter or '_'.
// - A name may appear once per operand, groups included; different operands may share
//   names (einsum "b i d, b j d -> b i j").
// - Recovery: all lexical errors are reported; a ',' inside a group is reported and the
//   group goes on if a ')' follows on the same side, otherwise the group is reported as
//   unclosed and ends at the ','. Tokens after a second '->' are ignored.
#include "frontend/einops_pattern.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string_view>

namespace napkin::frontend {
namespace {

enum class Kind { Name, One, Open, Close, Comma, Arrow, Invalid, End };

struct Token {
  Kind kind = Kind::End;
  int offset = 0;
  std::string text;
};

constexpr std::string_view kUnicodeArrow = "\xE2\x86\x92";  // U+2192, pasted from docs instead of "->"

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string quoted(std::string_view s) { return fmt::format("'{}'", s); }
std::string column(int offset) { return std::to_string(offset + 1); }

// Splits a pattern into tokens; problems become Invalid tokens plus an error, so the
// parser can skip them without reporting anything twice.
class Lexer {
 public:
  Lexer(const std::string& source, std::vector<PatternError>& errors) : src_(source), errors_(errors) {}

  std::vector<Token> run() {
    std::vector<Token> tokens;
    do {
      tokens.push_back(next());
    } while (tokens.back().kind != Kind::End);
    return tokens;
  }

 private:
  Token next() {
    while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    if (pos_ == src_.size()) return token(Kind::End, 0);
    std::string_view rest = std::string_view(src_).substr(pos_);
    switch (rest[0]) {
      case '(': return token(Kind::Open, 1);
      case ')': return token(Kind::Close, 1);
      case ',': return token(Kind::Comma, 1);
      case '>': return invalid(1, "'>' must follow '-' to form '->'");
      default: break;
    }
    if (rest.starts_with("->")) return token(Kind::Arrow, 2);
    if (rest[0] == '-') return invalid(1, "'-' must be followed by '>' to form '->'");
    if (rest.starts_with(kUnicodeArrow)) {
      return invalid(kUnicodeArrow.size(), quoted(kUnicodeArrow) + " is not an arrow here: write '->'");
    }
    if (rest.starts_with("...")) return invalid(3, "'...' is not supported: napkin shapes are static; name every axis");
    if (is_word_char(rest[0])) return word();
    return invalid(character_length(), "unexpected character " + quoted(rest.substr(0, character_length())) +
                                           " in an einops pattern");
  }

  Token word() {
    size_t length = 0;
    while (pos_ + length < src_.size() && is_word_char(src_[pos_ + length])) ++length;
    std::string text = src_.substr(pos_, length);
    if (text == "1") return token(Kind::One, 1);
    if (text.find_first_not_of("0123456789") == std::string::npos) {
      return invalid(text.size(), quoted(text) + " is not an axis: the only number allowed is 1 (an axis of size one)");
    }
    if (is_digit(text[0])) {
      return invalid(text.size(), "invalid axis name " + quoted(text) + ": names start with a letter or '_'");
    }
    return token(Kind::Name, text.size());
  }

  // A multi-byte UTF-8 character is one unexpected character, not several.
  size_t character_length() const {
    size_t length = 1;
    if (static_cast<unsigned char>(src_[pos_]) >= 0xC0) {
      while (pos_ + length < src_.size() && (static_cast<unsigned char>(src_[pos_ + length]) & 0xC0) == 0x80) {
        ++length;
      }
    }
    return length;
  }

  Token token(Kind kind, size_t length) {
    Token t{kind, static_cast<int>(pos_), src_.substr(pos_, length)};
    pos_ += length;
    return t;
  }

  Token invalid(size_t length, std::string message) {
    errors_.push_back({static_cast<int>(pos_), std::move(message)});
    return token(Kind::Invalid, length);
  }

  const std::string& src_;
  std::vector<PatternError>& errors_;
  size_t pos_ = 0;
};

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, std::vector<PatternError>& errors) : tokens_(tokens), errors_(errors) {}

  Pattern run() {
    std::vector<size_t> arrows;
    for (size_t i = 0; i < tokens_.size(); ++i) {
      if (tokens_[i].kind == Kind::Arrow) arrows.push_back(i);
    }
    Pattern pattern;
    if (arrows.empty()) {
      if (!broken_arrow()) error(tokens_.back().offset, "an einops pattern needs '->' between inputs and output");
      return pattern;
    }
    for (size_t i = 1; i < arrows.size(); ++i) {
      error(tokens_[arrows[i]].offset, "only one '->' is allowed in a pattern");
    }
    pattern.inputs = inputs(arrows[0]);
    pos_ = arrows[0] + 1;
    pattern.output = output(arrows.size() > 1 ? arrows[1] : tokens_.size() - 1);
    return pattern;
  }

 private:
  std::vector<PatternSide> inputs(size_t arrow) {
    std::vector<PatternSide> sides;
    while (true) {
      size_t start = pos_;
      std::string label = "operand " + std::to_string(sides.size() + 1);
      sides.push_back(operand(label, arrow));
      if (pos_ == start) error(sides.back().offset, label + " has no axes: every input needs at least one axis");
      if (pos_ == arrow) return sides;
      ++pos_;  // the ','
    }
  }

  PatternSide output(size_t end) {
    PatternSide side = operand("the output", end);
    if (pos_ < end) error(tokens_[pos_].offset, "the output must be a single operand: unexpected ','");
    return side;
  }

  // One operand: axes up to a ',' or `end`.
  PatternSide operand(const std::string& label, size_t end) {
    PatternSide side;
    side.offset = tokens_[pos_].offset;
    std::set<std::string> seen;
    while (pos_ < end && tokens_[pos_].kind != Kind::Comma) {
      const Token& t = tokens_[pos_];
      if (t.kind == Kind::Open) {
        side.axes.push_back(group(seen, label, end));
        continue;
      }
      ++pos_;
      if (t.kind == Kind::Name) {
        note_name(t, seen, label);
        side.axes.push_back({{t.text}, false, t.offset});
      } else if (t.kind == Kind::One) {
        side.axes.push_back({{}, false, t.offset});
      } else if (t.kind == Kind::Close) {
        error(t.offset, "unmatched ')'");
      }
    }
    return side;
  }

  PatternAxis group(std::set<std::string>& seen, const std::string& label, size_t end) {
    const Token& open = tokens_[pos_++];
    PatternAxis axis{{}, true, open.offset};
    bool closes = close_ahead(end);
    for (int nested = 0; pos_ < end; ++pos_) {
      const Token& t = tokens_[pos_];
      if (t.kind == Kind::Comma && !closes) break;
      if (t.kind == Kind::Close && nested == 0) {
        ++pos_;
        return axis;
      }
      if (t.kind == Kind::Close) {
        --nested;
      } else if (t.kind == Kind::Name) {
        note_name(t, seen, label);
        axis.names.push_back(t.text);
      } else if (t.kind == Kind::Open) {
        ++nested;
        error(t.offset, "nested parentheses are not allowed in einops patterns");
      } else {
        group_misfit(t);
      }
    }
    error(open.offset, "'(' at column " + column(open.offset) + " is never closed");
    return axis;
  }

  void group_misfit(const Token& t) {
    if (t.kind == Kind::One) {
      error(t.offset, "'1' cannot appear inside a group: a group lists named axes (write '()' for a size-one axis)");
    } else if (t.kind == Kind::Comma) {
      error(t.offset, "',' cannot appear inside a group: separate axes with spaces");
    }
  }

  // A lone '-' or '>', or a Unicode arrow, is already reported as a malformed arrow.
  bool broken_arrow() const {
    return std::any_of(tokens_.begin(), tokens_.end(), [](const Token& t) {
      return t.kind == Kind::Invalid && (t.text == "-" || t.text == ">" || t.text == kUnicodeArrow);
    });
  }

  bool close_ahead(size_t end) const {
    for (size_t i = pos_; i < end; ++i) {
      if (tokens_[i].kind == Kind::Close) return true;
    }
    return false;
  }

  void note_name(const Token& t, std::set<std::string>& seen, const std::string& label) {
    if (!seen.insert(t.text).second) error(t.offset, "axis " + quoted(t.text) + " appears twice in " + label);
  }

  void error(int offset, std::string message) { errors_.push_back({offset, std::move(message)}); }

  const std::vector<Token>& tokens_;
  std::vector<PatternError>& errors_;
  size_t pos_ = 0;
};

}  // namespace

PatternResult parse_pattern(const std::string& pattern) {
  PatternResult result;
  std::vector<Token> tokens = Lexer(pattern, result.errors).run();
  result.pattern = Parser(tokens, result.errors).run();
  std::stable_sort(result.errors.begin(), result.errors.end(),
                   [](const PatternError& a, const PatternError& b) { return a.offset < b.offset; });
  return result;
}

}  // namespace napkin::frontend
