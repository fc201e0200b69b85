// Lexer, recursive-descent parser and printer for model-file expression strings.
//
// Grammar decisions (the contract is expr_ast.h; these fill in what it leaves open):
// - Numbers: digits, optionally '.' and more digits, optionally an exponent
//   ("3", "0.02", "3e-4", "1.e5"). Like Python, ".5" and "5." are accepted: both are
//   unambiguous and common in hand-written hyperparameters. A number glued to a
//   letter, digit or dot ("3d", "1.2.3", "1e") is one "invalid number" error.
//   Literals are never negative: "-1" is Unary("-", 1).
// - Names: [A-Za-z_][A-Za-z0-9_.]*, so "blocks.3.w" is one Name; a name may not
//   end with '.' or contain "..".
// - Strings: '...' or "..." with escapes \" \' \\ \n \t; any other escape is an error.
// - A parenthesized expression is its inner node, and keeps the inner offset, so the
//   offset of "(a + b) * c" is that of 'a'.
// - Only a name can be called (f(x), nn.relu(x)); f(x)(y) is an error.
// - Trailing commas are allowed in calls, lists and subscripts; x[] and slice steps
//   (x[::2]) are errors.
// - Error recovery: a bad call argument, list element or subscript item is reported and
//   skipped up to the next ',' or closing bracket of its own list, so one string can
//   yield several independent errors; anything else stops at the first syntax error.
//   Lexical errors (bad characters, unterminated strings) are always all reported.
#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <utility>

#include "frontend/expr_ast.h"

namespace napkin::frontend {
namespace {

// Recursion in the parser, in to_string, in ~Expr and in every later tree walk follows
// the tree depth, which the token count bounds (a + b + ... nests to the left). Real
// expressions have tens of tokens; these limits keep fuzzed input off the stack's end.
constexpr int kMaxNesting = 200;
constexpr size_t kMaxTokens = 1000;

constexpr std::array<std::string_view, 6> kComparisonOps = {"==", "!=", "<=", ">=", "<", ">"};

// Longest first, so "**" wins over "*".
constexpr std::array<std::string_view, 21> kPunctuators = {
    "**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%",
    "@",  "<",  ">",  "=",  "(",  ")",  "[", "]", ",", ":"};

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c) || c == '.'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }
std::string column(int offset) { return std::to_string(offset + 1); }

// ---------------------------------------------------------------------------------
// Lexer

enum class TokenKind { Number, String, Name, Punct, Error, End };

struct Token {
  TokenKind kind = TokenKind::End;
  int offset = 0;
  std::string text;  // Number/Name/Punct: spelling; String: decoded contents; Error: message
  double number = 0;
};

// Shows one offending character; a multi-byte UTF-8 character is shown whole.
std::string character_at(const std::string& s, size_t pos, size_t* length) {
  auto byte = static_cast<unsigned char>(s[pos]);
  *length = 1;
  if (byte >= 0xC0) {
    while (pos + *length < s.size() && (static_cast<unsigned char>(s[pos + *length]) & 0xC0) == 0x80) {
      ++*length;
    }
  }
  if (byte < 0x20 || byte == 0x7F) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02X", byte);
    return hex;
  }
  return s.substr(pos, *length);
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(source) {}

  std::vector<Token> run() {
    std::vector<Token> tokens;
    do {
      tokens.push_back(next());
    } while (tokens.back().kind != TokenKind::End);
    return tokens;
  }

 private:
  Token next() {
    while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    if (pos_ == src_.size()) return make(TokenKind::End, pos_, "");
    char c = src_[pos_];
    if (is_digit(c) || (c == '.' && pos_ + 1 < src_.size() && is_digit(src_[pos_ + 1]))) return number();
    if (is_name_start(c)) return name();
    if (c == '"' || c == '\'') return string();
    for (std::string_view p : kPunctuators) {
      if (std::string_view(src_).substr(pos_, p.size()) == p) {
        pos_ += p.size();
        return make(TokenKind::Punct, pos_ - p.size(), std::string(p));
      }
    }
    size_t length = 0;
    std::string shown = character_at(src_, pos_, &length);
    pos_ += length;
    return make(TokenKind::Error, pos_ - length, "unexpected character " + quoted(shown));
  }

  Token number() {
    size_t start = pos_;
    skip_digits();
    if (peek_is('.')) {
      ++pos_;
      skip_digits();
    }
    if (exponent_follows()) {
      pos_ += (src_[pos_ + 1] == '+' || src_[pos_ + 1] == '-') ? 2 : 1;
      skip_digits();
    }
    std::string spelling = src_.substr(start, pos_ - start);
    if (pos_ < src_.size() && is_name_char(src_[pos_])) return invalid_number(start, spelling);
    Token t = make(TokenKind::Number, start, spelling);
    auto [end, ec] = std::from_chars(spelling.data(), spelling.data() + spelling.size(), t.number);
    if (ec != std::errc() || end != spelling.data() + spelling.size()) {
      return make(TokenKind::Error, start, "number " + quoted(spelling) + " is out of range");
    }
    return t;
  }

  // "3d" is far more likely a missing '*' than a typo in the number.
  Token invalid_number(size_t start, const std::string& number_part) {
    char next = src_[pos_];
    while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
    std::string whole = src_.substr(start, pos_ - start);
    std::string message = "invalid number " + quoted(whole);
    bool digits_only = number_part.find_first_not_of("0123456789") == std::string::npos;
    if (digits_only && is_name_start(next) && next != 'e' && next != 'E') {
      message += "; to multiply, write " + quoted(number_part + "*" + whole.substr(number_part.size()));
    }
    return make(TokenKind::Error, start, message);
  }

  bool exponent_follows() const {
    if (!peek_is('e') && !peek_is('E')) return false;
    size_t digit = pos_ + 1;
    if (digit < src_.size() && (src_[digit] == '+' || src_[digit] == '-')) ++digit;
    return digit < src_.size() && is_digit(src_[digit]);
  }

  Token name() {
    size_t start = pos_;
    while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
    std::string spelling = src_.substr(start, pos_ - start);
    if (spelling.back() == '.' || spelling.find("..") != std::string::npos) {
      return make(TokenKind::Error, start,
                  "invalid name " + quoted(spelling) + ": dots must separate non-empty parts, as in 'blocks.3.w'");
    }
    return make(TokenKind::Name, start, spelling);
  }

  Token string() {
    size_t start = pos_;
    char quote = src_[pos_++];
    std::string text;
    std::optional<Token> bad_escape;  // the first one, reported once the whole string is skipped
    while (pos_ < src_.size() && src_[pos_] != quote) {
      if (src_[pos_] == '\\') {
        escape(text, bad_escape);
      } else {
        text += src_[pos_++];
      }
    }
    if (pos_ == src_.size()) {
      std::string opened = column(static_cast<int>(start));
      return make(TokenKind::Error, start,
                  "unterminated string: no closing " + std::string(1, quote) + " for the quote at column " + opened);
    }
    ++pos_;
    if (bad_escape) return *bad_escape;
    return make(TokenKind::String, start, text);
  }

  // Decodes the escape at pos_; a backslash at the very end leaves the string unterminated.
  void escape(std::string& text, std::optional<Token>& bad_escape) {
    if (pos_ + 1 == src_.size()) {
      pos_ = src_.size();
      return;
    }
    char decoded = unescape(src_[pos_ + 1]);
    if (decoded == 0 && !bad_escape) {
      std::string shown = quoted(src_.substr(pos_, 2));
      bad_escape = make(TokenKind::Error, pos_, "unknown escape " + shown + " in string; use \\\" \\' \\\\ \\n or \\t");
    }
    text += decoded;
    pos_ += 2;
  }

  static char unescape(char c) {
    switch (c) {
      case '"': case '\'': case '\\': return c;
      case 'n': return '\n';
      case 't': return '\t';
      default: return 0;
    }
  }

  void skip_digits() {
    while (pos_ < src_.size() && is_digit(src_[pos_])) ++pos_;
  }
  bool peek_is(char c) const { return pos_ < src_.size() && src_[pos_] == c; }

  static Token make(TokenKind kind, size_t offset, std::string text) {
    return Token{kind, static_cast<int>(offset), std::move(text), 0};
  }

  const std::string& src_;
  size_t pos_ = 0;
};

std::vector<ParseError> lexical_errors(const std::vector<Token>& tokens) {
  std::vector<ParseError> errors;
  for (const Token& t : tokens) {
    if (t.kind == TokenKind::Error) errors.push_back({t.offset, t.text});
  }
  return errors;
}

void sort_by_offset(std::vector<ParseError>& errors) {
  std::stable_sort(errors.begin(), errors.end(),
                   [](const ParseError& a, const ParseError& b) { return a.offset < b.offset; });
}

std::string describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::End: return "the end of the expression";
    case TokenKind::String: return "a string";
    default: return quoted(t.text);
  }
}

// ---------------------------------------------------------------------------------
// Parser

// Thrown once an error is recorded (or a lexical error is hit); caught where parsing
// can resynchronize, which is only at the items of a comma list.
struct Abort {};

// Restores the nesting depth however the level is left, Abort included.
struct NestingGuard {
  int& depth;
  ~NestingGuard() { --depth; }
};

const char* const kAssignHint = "'=' is not an operator here: did you mean '=='?";

ExprPtr make_node(ExprKind kind, int offset, std::string text = "") {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->offset = offset;
  e->text = std::move(text);
  return e;
}

ExprPtr make_operator(ExprKind kind, const Token& op, int offset, ExprPtr lhs, ExprPtr rhs = nullptr) {
  ExprPtr e = make_node(kind, offset, op.text);
  e->op_offset = op.offset;
  e->args.push_back(std::move(lhs));
  if (rhs) e->args.push_back(std::move(rhs));
  return e;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  std::vector<ParseError> parse(ExprPtr* result) {
    try {
      ExprPtr e = expression();
      if (!at_end()) fail(cur(), trailing_message());
      *result = std::move(e);
    } catch (const Abort&) {
    }
    return std::move(errors_);
  }

 private:
  // Precedence levels, lowest first; each calls the next.
  ExprPtr expression() {
    ExprPtr lhs = additive();
    if (!at_any(kComparisonOps)) return lhs;
    Token op = advance();
    int offset = lhs->offset;
    ExprPtr e = make_operator(ExprKind::Binary, op, offset, std::move(lhs), additive());
    if (at_any(kComparisonOps)) {
      fail(cur(), "comparisons cannot be chained: put one of them in parentheses");
    }
    return e;
  }

  ExprPtr additive() { return left_assoc({"+", "-"}, &Parser::multiplicative); }
  ExprPtr multiplicative() { return left_assoc({"*", "/", "//", "%", "@"}, &Parser::unary); }

  ExprPtr left_assoc(std::initializer_list<std::string_view> ops, ExprPtr (Parser::*operand)()) {
    ExprPtr lhs = (this->*operand)();
    while (at_any(ops)) {
      Token op = advance();
      int offset = lhs->offset;
      lhs = make_operator(ExprKind::Binary, op, offset, std::move(lhs), (this->*operand)());
    }
    return lhs;
  }

  // Every nesting path (parentheses, brackets, calls, unary chains) passes through here.
  ExprPtr unary() {
    if (depth_ >= kMaxNesting) {
      fail(cur(), "expression is nested too deeply (more than " + std::to_string(kMaxNesting) + " levels)");
    }
    ++depth_;
    NestingGuard guard{depth_};
    if (!at("-") && !at("+")) return power();
    Token op = advance();
    return make_operator(ExprKind::Unary, op, op.offset, unary());
  }

  // The exponent is a unary expression, so ** is right-associative and 2**-1 works.
  ExprPtr power() {
    ExprPtr base = postfix();
    if (!at("**")) return base;
    Token op = advance();
    int offset = base->offset;
    return make_operator(ExprKind::Binary, op, offset, std::move(base), unary());
  }

  ExprPtr postfix() {
    ExprPtr e = primary();
    while (true) {
      if (at("(")) {
        e = call(std::move(e));
      } else if (at("[")) {
        e = subscript(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr primary() {
    const Token& t = cur();
    if (t.kind == TokenKind::Number) {
      ExprPtr e = make_node(ExprKind::Number, t.offset);
      e->number = t.number;
      e->is_integer = t.text.find_first_not_of("0123456789") == std::string::npos;
      advance();
      return e;
    }
    if (t.kind == TokenKind::String || t.kind == TokenKind::Name) {
      ExprPtr e = make_node(t.kind == TokenKind::String ? ExprKind::String : ExprKind::Name, t.offset, t.text);
      advance();
      return e;
    }
    if (at("(")) return parenthesized();
    if (at("[")) return list();
    fail(t, missing_operand_message());
  }

  ExprPtr parenthesized() {
    Token open = open_bracket();
    ExprPtr inner = expression();
    if (!at(")")) fail(cur(), close_message(")", "the '('", open.offset, false));
    close_bracket();
    return inner;
  }

  ExprPtr list() {
    Token open = open_bracket();
    ExprPtr e = make_node(ExprKind::List, open.offset);
    comma_list("]", "the list", open.offset, [&] { e->args.push_back(expression()); });
    return e;
  }

  ExprPtr call(ExprPtr callee) {
    if (callee->kind != ExprKind::Name) {
      fail(cur(), "only a function name can be called: is an operator missing before '('?");
    }
    ExprPtr e = make_node(ExprKind::Call, callee->offset, callee->text);
    open_bracket();
    std::string last_keyword;
    comma_list(")", "the call to " + quoted(e->text), e->offset, [&] { argument(*e, last_keyword); });
    return e;
  }

  void argument(Expr& call, std::string& last_keyword) {
    if (cur().kind == TokenKind::Name && peek_is(1, "=")) return keyword_argument(call, last_keyword);
    int offset = cur().offset;
    ExprPtr value = expression();
    if (last_keyword.empty()) {
      call.args.push_back(std::move(value));
    } else if (at(",") || at(")")) {  // otherwise the argument is malformed, which says more
      error(offset, "positional argument after keyword argument " + quoted(last_keyword));
    }
  }

  void keyword_argument(Expr& call, std::string& last_keyword) {
    Token name = advance();
    advance();  // '='
    last_keyword = name.text;
    if (name.text.find('.') != std::string::npos) {
      error(name.offset, "keyword argument name " + quoted(name.text) + " cannot contain '.'");
    }
    if (!can_start_expression(cur())) fail(cur(), "expected a value after " + quoted(name.text + "="));
    ExprPtr value = expression();
    bool repeated = std::any_of(call.kwargs.begin(), call.kwargs.end(),
                                [&](const KeywordArg& k) { return k.name == name.text; });
    if (repeated) {
      error(name.offset, "keyword argument " + quoted(name.text) + " given twice");
      return;
    }
    call.kwargs.push_back({name.text, std::move(value), name.offset});
  }

  ExprPtr subscript(ExprPtr base) {
    Token open = open_bracket();
    if (at("]")) fail(cur(), "empty subscript: write an index or a slice, as in x[0] or x[1:3]");
    ExprPtr e = make_node(ExprKind::Subscript, base->offset);
    e->args.push_back(std::move(base));
    comma_list("]", "the subscript", open.offset, [&] { e->slices.push_back(slice_item()); });
    return e;
  }

  SliceItem slice_item() {
    SliceItem item;
    item.offset = cur().offset;
    if (!at(":")) item.start = expression();
    if (!at(":")) return item;
    advance();
    item.is_slice = true;
    if (!at(":") && !at(",") && !at("]") && !at_end()) item.stop = expression();
    if (at(":")) fail(cur(), "slice steps (x[a:b:step]) are not supported");
    return item;
  }

  // Parses `item`s separated by commas up to `close`. A failed item is skipped up to
  // the next ',' or `close` of this list so that later items still get checked.
  template <class Item>
  void comma_list(std::string_view close, const std::string& what, int opened_at, Item item) {
    size_t level = closers_.size();
    while (!at(close)) {
      try {
        if (at_end()) fail(cur(), close_message(close, what, opened_at, true));
        item();
        if (!at(",") && !at(close)) fail(cur(), close_message(close, what, opened_at, true));
      } catch (const Abort&) {
        skip_rest_of_item(level);
        if (!at(",") && !at(close)) throw;  // the end, or an enclosing bracket's close
      }
      if (at(",")) advance();
    }
    close_bracket();
  }

  // Skips from wherever an item failed, possibly inside brackets the item opened, to
  // the next ',' or closing bracket at the list's own bracket `level`.
  void skip_rest_of_item(size_t level) {
    for (; !at_end(); advance()) {
      bool at_level = closers_.size() == level;
      if (at("(") || at("[")) {
        closers_.push_back(at("(") ? ")" : "]");
      } else if (!at(")") && !at("]")) {
        if (at_level && at(",")) return;
      } else if (!at_level) {
        closers_.pop_back();
      } else if (at(closers_.back()) || (level >= 2 && at(closers_[level - 2]))) {
        return;  // closes this list or the enclosing bracket; any other is a stray, skipped
      }
    }
  }

  // --- messages ---

  std::string close_message(std::string_view close, const std::string& what, int opened_at,
                            bool commas) const {
    std::string where = what + " opened at column " + column(opened_at);
    if (at_end()) return "expected " + quoted(close) + " to close " + where;
    if (at("=")) return kAssignHint;
    if (commas) return "expected ',' or " + quoted(close) + " in " + where + ", found " + describe(cur());
    return "expected " + quoted(close) + " to close " + where + ", found " + describe(cur());
  }

  std::string missing_operand_message() const {
    if (pos_ == 0) return at_end() ? "empty expression" : "expected an expression, found " + describe(cur());
    return "expected an expression after " + quoted(tokens_[pos_ - 1].text);
  }

  std::string trailing_message() const {
    if (at(")") || at("]")) return "unmatched " + quoted(cur().text);
    if (at("=")) return kAssignHint;
    if (at(",")) return "unexpected ',': an expression string holds one expression (write a list as [a, b])";
    if (at(":")) return "':' is only allowed in a subscript such as x[1:3]";
    return "expected an operator or the end of the expression, found " + describe(cur());
  }

  // --- token access ---

  const Token& cur() const { return tokens_[pos_]; }
  bool at_end() const { return cur().kind == TokenKind::End; }
  bool at(std::string_view punct) const { return peek_is(0, punct); }
  bool peek_is(size_t ahead, std::string_view punct) const {
    const Token& t = tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
    return t.kind == TokenKind::Punct && t.text == punct;
  }
  template <class Ops>
  bool at_any(const Ops& ops) const {
    return std::any_of(ops.begin(), ops.end(), [&](std::string_view op) { return at(op); });
  }
  Token open_bracket() {
    closers_.push_back(at("(") ? ")" : "]");
    return advance();
  }
  void close_bracket() {
    closers_.pop_back();
    advance();
  }
  Token advance() {
    Token t = cur();
    if (!at_end()) ++pos_;
    return t;
  }

  static bool can_start_expression(const Token& t) {
    if (t.kind == TokenKind::Punct) return t.text == "(" || t.text == "[" || t.text == "-" || t.text == "+";
    return t.kind != TokenKind::End && t.kind != TokenKind::Error;
  }

  void error(int offset, std::string message) { errors_.push_back({offset, std::move(message)}); }

  // Lexical errors are reported by parse_expression, so an Error token only aborts.
  [[noreturn]] void fail(const Token& where, std::string message) {
    if (where.kind != TokenKind::Error) error(where.offset, std::move(message));
    throw Abort{};
  }

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::vector<std::string_view> closers_;  // for each open bracket, innermost last: what closes it
  std::vector<ParseError> errors_;
};

// ---------------------------------------------------------------------------------
// Printer

enum Precedence { kComparison = 1, kAdditive, kMultiplicative, kUnary, kPower, kAtom };

int precedence(const Expr& e) {
  if (e.kind == ExprKind::Unary) return kUnary;
  // A negative literal (only built by later passes) prints with a leading '-'.
  if (e.kind == ExprKind::Number && e.number < 0) return kUnary;
  if (e.kind != ExprKind::Binary) return kAtom;
  if (e.text == "**") return kPower;
  if (e.text == "+" || e.text == "-") return kAdditive;
  bool comparison = std::find(kComparisonOps.begin(), kComparisonOps.end(), e.text) != kComparisonOps.end();
  return comparison ? kComparison : kMultiplicative;
}

std::string render(const Expr& e, int min_precedence) {
  std::string s = to_string(e);
  return precedence(e) < min_precedence ? "(" + s + ")" : s;
}

// Canonical spelling: integers in full, other numbers in their shortest round-trip form
// with a tidy exponent ("3e-4", not "3e-04") and always a '.' or 'e' so is_integer survives.
std::string render_number(const Expr& e) {
  char buffer[400];
  auto result = e.is_integer ? std::to_chars(buffer, buffer + sizeof buffer, e.number, std::chars_format::fixed)
                             : std::to_chars(buffer, buffer + sizeof buffer, e.number);
  std::string s(buffer, result.ptr);
  if (e.is_integer) return s;
  size_t exp = s.find('e');
  if (exp == std::string::npos) return s.find('.') == std::string::npos ? s + ".0" : s;
  std::string mantissa = s.substr(0, exp);
  std::string power = s.substr(exp + 1);
  std::string sign = power[0] == '-' ? "-" : "";
  power.erase(0, power.find_first_not_of("+-0"));
  return mantissa + "e" + sign + power;
}

std::string render_string(const std::string& text) {
  std::string s = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      s += '\\';
      s += c;
    } else if (c == '\n') {
      s += "\\n";
    } else if (c == '\t') {
      s += "\\t";
    } else {
      s += c;
    }
  }
  return s + "\"";
}

std::string render_binary(const Expr& e) {
  int p = precedence(e);
  int left_min = p == kAdditive || p == kMultiplicative ? p : p + 1;  // left-assoc levels
  int right_min = p == kPower ? kUnary : p + 1;                       // 2 ** -x needs no parens
  return render(*e.args[0], left_min) + " " + e.text + " " + render(*e.args[1], right_min);
}

std::string render_call(const Expr& e) {
  std::string s = e.text + "(";
  const char* sep = "";
  for (const ExprPtr& arg : e.args) {
    s += sep + to_string(*arg);
    sep = ", ";
  }
  for (const KeywordArg& k : e.kwargs) {
    s += sep + k.name + "=" + to_string(*k.value);
    sep = ", ";
  }
  return s + ")";
}

std::string render_list(const Expr& e) {
  std::string s = "[";
  for (size_t i = 0; i < e.args.size(); ++i) s += (i ? ", " : "") + to_string(*e.args[i]);
  return s + "]";
}

std::string render_subscript(const Expr& e) {
  std::string s = render(*e.args[0], kAtom) + "[";
  for (size_t i = 0; i < e.slices.size(); ++i) {
    const SliceItem& item = e.slices[i];
    if (i) s += ", ";
    if (item.start) s += to_string(*item.start);
    if (item.is_slice) s += ":";
    if (item.stop) s += to_string(*item.stop);
  }
  return s + "]";
}

}  // namespace

ParseResult parse_expression(const std::string& source) {
  std::vector<Token> tokens = Lexer(source).run();
  ParseResult result;
  if (tokens.size() > kMaxTokens) {
    result.errors.push_back({0, "expression is too long (more than " + std::to_string(kMaxTokens) + " tokens)"});
    return result;
  }
  result.errors = Parser(tokens).parse(&result.expr);
  std::vector<ParseError> lexical = lexical_errors(tokens);
  result.errors.insert(result.errors.end(), lexical.begin(), lexical.end());
  sort_by_offset(result.errors);
  if (!result.errors.empty()) result.expr.reset();
  return result;
}

namespace {

bool is_comma(const Token& t) { return t.kind == TokenKind::Punct && t.text == ","; }

// Checks the comma-separated segment that starts at tokens[i], which must be exactly
// one name; returns the index of the ',' or End that closes the segment.
size_t target_segment(const std::vector<Token>& tokens, size_t i, TargetList& out) {
  const Token& t = tokens[i];
  if (t.kind == TokenKind::Name) {
    bool seen = std::any_of(out.names.begin(), out.names.end(), [&](const auto& n) { return n.first == t.text; });
    if (seen) out.errors.push_back({t.offset, quoted(t.text) + " assigned twice in one target list"});
    out.names.emplace_back(t.text, t.offset);
    const Token& after = tokens[++i];
    if (after.kind != TokenKind::End && after.kind != TokenKind::Error && !is_comma(after)) {
      out.errors.push_back({after.offset, "expected ',' between target names, found " + describe(after)});
    }
  } else if (t.kind == TokenKind::End && i == 0) {
    out.errors.push_back({t.offset, "empty target list: expected a name to assign to"});
  } else if (t.kind == TokenKind::End || is_comma(t)) {
    out.errors.push_back({t.offset, i == 0 ? "expected a name before ','" : "expected a name after ','"});
  } else if (t.kind != TokenKind::Error) {
    out.errors.push_back({t.offset, "expected a name in the target list, found " + describe(t)});
  }
  while (tokens[i].kind != TokenKind::End && !is_comma(tokens[i])) ++i;
  return i;
}

}  // namespace

TargetList parse_targets(const std::string& source) {
  std::vector<Token> tokens = Lexer(source).run();
  TargetList out;
  out.errors = lexical_errors(tokens);
  for (size_t i = target_segment(tokens, 0, out); tokens[i].kind != TokenKind::End;) {
    i = target_segment(tokens, i + 1, out);
  }
  sort_by_offset(out.errors);
  return out;
}

std::string to_string(const Expr& e) {
  switch (e.kind) {
    case ExprKind::Number: return render_number(e);
    case ExprKind::String: return render_string(e.text);
    case ExprKind::Name: return e.text;
    case ExprKind::Call: return render_call(e);
    case ExprKind::Unary: return e.text + render(*e.args[0], kUnary);
    case ExprKind::Binary: return render_binary(e);
    case ExprKind::List: return render_list(e);
    case ExprKind::Subscript: return render_subscript(e);
  }
  return "";
}

}  // namespace napkin::frontend
