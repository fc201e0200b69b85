// Tests for the expression parser (frontend/expr_ast.h): trees, offsets, errors, printing.
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

#include "frontend/expr_ast.h"

using namespace napkin::frontend;

namespace {

// Compact, offset-free rendering of a tree so expected shapes read at a glance:
// (op lhs rhs), (neg x), (call f args k=v), [a b], (sub x 0 1:3 :), 3 / 0.5f / "s".
std::string sexpr(const Expr& e);

std::string sexpr_slice(const SliceItem& s) {
  std::string out = s.start ? sexpr(*s.start) : "";
  if (s.is_slice) out += ":" + (s.stop ? sexpr(*s.stop) : "");
  return out;
}

std::string sexpr(const Expr& e) {
  std::ostringstream out;
  switch (e.kind) {
    case ExprKind::Number: out << e.number << (e.is_integer ? "" : "f"); break;
    case ExprKind::String: out << '"' << e.text << '"'; break;
    case ExprKind::Name: out << e.text; break;
    case ExprKind::Call:
      out << "(call " << e.text;
      for (const auto& a : e.args) out << ' ' << sexpr(*a);
      for (const auto& k : e.kwargs) out << ' ' << k.name << '=' << sexpr(*k.value);
      out << ')';
      break;
    case ExprKind::Unary: out << '(' << (e.text == "-" ? "neg" : "pos") << ' ' << sexpr(*e.args[0]) << ')'; break;
    case ExprKind::Binary: out << '(' << e.text << ' ' << sexpr(*e.args[0]) << ' ' << sexpr(*e.args[1]) << ')'; break;
    case ExprKind::List:
      out << '[';
      for (size_t i = 0; i < e.args.size(); ++i) out << (i ? " " : "") << sexpr(*e.args[i]);
      out << ']';
      break;
    case ExprKind::Subscript:
      out << "(sub " << sexpr(*e.args[0]);
      for (const auto& s : e.slices) out << ' ' << sexpr_slice(s);
      out << ')';
      break;
  }
  return out.str();
}

std::string messages(const ParseResult& r) {
  std::string all;
  for (const auto& e : r.errors) all += "  @" + std::to_string(e.offset) + ": " + e.message + "\n";
  return all;
}

ExprPtr parse_ok(const std::string& source) {
  ParseResult r = parse_expression(source);
  INFO("source: ", source, "\nerrors:\n", messages(r));
  REQUIRE(r.errors.empty());
  REQUIRE(r.expr);
  return std::move(r.expr);
}

std::string tree(const std::string& source) { return sexpr(*parse_ok(source)); }

std::string canonical(const std::string& source) { return to_string(*parse_ok(source)); }

// The first error must sit at `offset` and mention `text`.
void check_error(const std::string& source, int offset, const std::string& text) {
  ParseResult r = parse_expression(source);
  INFO("source: ", source, "\nerrors:\n", messages(r));
  CHECK_FALSE(r.expr);
  REQUIRE_FALSE(r.errors.empty());
  CHECK(r.errors[0].offset == offset);
  CHECK(r.errors[0].message.find(text) != std::string::npos);
}

// Exactly one error: nothing cascades from it.
void check_single_error(const std::string& source, int offset, const std::string& text) {
  check_error(source, offset, text);
  CHECK(parse_expression(source).errors.size() == 1);
}

}  // namespace

TEST_CASE("expr: number literals") {
  auto n = parse_ok("3");
  CHECK(n->kind == ExprKind::Number);
  CHECK(n->number == 3);
  CHECK(n->is_integer);

  struct Case {
    const char* source;
    double value;
    bool integer;
  };
  for (Case c : {Case{"0.02", 0.02, false}, Case{"3e-4", 3e-4, false}, Case{"1E5", 1e5, false},
                 Case{"1e+5", 1e5, false}, Case{".5", 0.5, false}, Case{"5.", 5.0, false},
                 Case{"1.e5", 1e5, false}, Case{"007", 7, true}, Case{"1e-5", 1e-5, false},
                 Case{"123456789012345678901234567890", 123456789012345678901234567890.0, true}}) {
    INFO(c.source);
    auto e = parse_ok(c.source);
    REQUIRE(e->kind == ExprKind::Number);
    CHECK(e->number == c.value);
    CHECK(e->is_integer == c.integer);
  }
}

TEST_CASE("expr: strings, names and escapes") {
  auto s = parse_ok("\"b s d, d e -> b s e\"");
  CHECK(s->kind == ExprKind::String);
  CHECK(s->text == "b s d, d e -> b s e");
  CHECK(parse_ok("'single'")->text == "single");
  CHECK(parse_ok(R"("a\"b\\c\nd")")->text == "a\"b\\c\nd");
  CHECK(parse_ok(R"('it\'s\t')")->text == "it's\t");
  CHECK(parse_ok(R"("it's")")->text == "it's");
  CHECK(parse_ok("''")->text.empty());

  auto name = parse_ok("blocks.3.w");
  CHECK(name->kind == ExprKind::Name);
  CHECK(name->text == "blocks.3.w");
  CHECK(tree("_x9 + head_dim") == "(+ _x9 head_dim)");
  CHECK(tree("fp32") == "fp32");
}

TEST_CASE("expr: precedence") {
  CHECK(tree("a + b * c") == "(+ a (* b c))");
  CHECK(tree("a * b + c") == "(+ (* a b) c)");
  CHECK(tree("a + b @ c") == "(+ a (@ b c))");
  CHECK(tree("a - b // c % d") == "(- a (% (// b c) d))");
  CHECK(tree("-x**2") == "(neg (** x 2))");
  CHECK(tree("-a * b") == "(* (neg a) b)");
  CHECK(tree("a * -b") == "(* a (neg b))");
  CHECK(tree("2 ** -1") == "(** 2 (neg 1))");
  CHECK(tree("a + b == c * d") == "(== (+ a b) (* c d))");
  CHECK(tree("(a + b) * c") == "(* (+ a b) c)");
  CHECK(tree("f(x)[0] ** 2") == "(** (sub (call f x) 0) 2)");
  CHECK(tree("-x[0]") == "(neg (sub x 0))");
  CHECK(tree("x > 0") == "(> x 0)");
  for (const char* op : {"==", "!=", "<", "<=", ">", ">="}) {
    CHECK(tree(std::string("a ") + op + " b + 1") == std::string("(") + op + " a (+ b 1))");
  }
}

TEST_CASE("expr: associativity") {
  CHECK(tree("a - b - c") == "(- (- a b) c)");
  CHECK(tree("a / b / c") == "(/ (/ a b) c)");
  CHECK(tree("a // b * c") == "(* (// a b) c)");
  CHECK(tree("a @ b @ c") == "(@ (@ a b) c)");
  CHECK(tree("a ** b ** c") == "(** a (** b c))");
  CHECK(tree("--x") == "(neg (neg x))");
  CHECK(tree("+x") == "(pos x)");
  CHECK(tree("(a < b) < c") == "(< (< a b) c)");
  CHECK(tree("a == (b == c)") == "(== a (== b c))");
}

TEST_CASE("expr: dim expressions") {
  CHECK(tree("d / heads") == "(/ d heads)");
  CHECK(tree("3*d") == "(* 3 d)");
  CHECK(tree("(d // 2) + 1") == "(+ (// d 2) 1)");
  CHECK(tree("1e-5") == "1e-05f");
}

TEST_CASE("expr: calls and keyword arguments") {
  CHECK(tree("f()") == "(call f)");
  CHECK(tree("f(a, b,)") == "(call f a b)");
  CHECK(tree("f(a,)") == "(call f a)");
  CHECK(tree("normal(0.02)") == "(call normal 0.02f)");
  CHECK(tree("nn.relu(x)") == "(call nn.relu x)");
  CHECK(tree("f(g(x), y=h(z))") == "(call f (call g x) y=(call h z))");
  CHECK(tree("softmax(causal_mask(einsum(q, k, \"b h i hd, b h j hd -> b h i j\") / sqrt(head_dim)), axis=-1)") ==
        "(call softmax (call causal_mask (/ (call einsum q k \"b h i hd, b h j hd -> b h i j\") (call sqrt head_dim))) "
        "axis=(neg 1))");
  CHECK(tree("adamw(lr=3e-4, betas=[0.9, 0.95], no_decay=[\"*_b\", \"ln*\"])") ==
        "(call adamw lr=0.0003f betas=[0.9f 0.95f] no_decay=[\"*_b\" \"ln*\"])");
  CHECK(tree("f(x, eq=a == b)") == "(call f x eq=(== a b))");

  auto call = parse_ok("f(x, axis=-1, keepdim=1)");
  REQUIRE(call->kwargs.size() == 2);
  CHECK(call->kwargs[0].name == "axis");
  CHECK(call->kwargs[0].offset == 5);
  CHECK(call->kwargs[1].name == "keepdim");
  CHECK(call->kwargs[1].offset == 14);
}

TEST_CASE("expr: lists") {
  CHECK(tree("[]") == "[]");
  CHECK(tree("[1, 2,]") == "[1 2]");
  CHECK(tree("[[1], [2, 3]]") == "[[1] [2 3]]");
  CHECK(tree("[a + 1, \"s\"]") == "[(+ a 1) \"s\"]");
}

TEST_CASE("expr: subscripts and slices") {
  CHECK(tree("x[0]") == "(sub x 0)");
  CHECK(tree("x[1:3]") == "(sub x 1:3)");
  CHECK(tree("x[:, 0]") == "(sub x : 0)");
  CHECK(tree("x[1:]") == "(sub x 1:)");
  CHECK(tree("x[:3]") == "(sub x :3)");
  CHECK(tree("x[-1]") == "(sub x (neg 1))");
  CHECK(tree("x[a + 1 : b]") == "(sub x (+ a 1):b)");
  CHECK(tree("x[0,]") == "(sub x 0)");
  CHECK(tree("x[0][1]") == "(sub (sub x 0) 1)");
  CHECK(tree("(a + b)[0]") == "(sub (+ a b) 0)");

  auto s = parse_ok("x[:, 2]");
  REQUIRE(s->slices.size() == 2);
  CHECK(s->slices[0].is_slice);
  CHECK_FALSE(s->slices[0].start);
  CHECK_FALSE(s->slices[0].stop);
  CHECK(s->slices[0].offset == 2);
  CHECK_FALSE(s->slices[1].is_slice);
  CHECK(s->slices[1].start->number == 2);
  CHECK(s->slices[1].offset == 5);
}

TEST_CASE("expr: offsets") {
  // x + einsum(y, w, "b s e, e d -> b s d") + b
  // 0   4      11 14 17                        42
  auto e = parse_ok("x + einsum(y, w, \"b s e, e d -> b s d\") + b");
  CHECK(e->offset == 0);
  const Expr& inner = *e->args[0];
  CHECK(inner.offset == 0);
  CHECK(inner.args[0]->offset == 0);
  const Expr& call = *inner.args[1];
  CHECK(call.kind == ExprKind::Call);
  CHECK(call.offset == 4);
  CHECK(call.args[0]->offset == 11);
  CHECK(call.args[1]->offset == 14);
  CHECK(call.args[2]->kind == ExprKind::String);
  CHECK(call.args[2]->offset == 17);
  CHECK(e->args[1]->offset == 42);

  CHECK(parse_ok("  x")->offset == 2);
  CHECK(parse_ok("a * -b")->args[1]->offset == 4);  // Unary: the operator
  CHECK(parse_ok("-x**2")->args[0]->offset == 1);
  CHECK(parse_ok("b * [1, 2]")->args[1]->offset == 4);  // List: the '['
  auto sub = parse_ok("1 + f(x)[0]");
  CHECK(sub->args[1]->kind == ExprKind::Subscript);
  CHECK(sub->args[1]->offset == 4);  // Subscript: its base
  // A parenthesized node keeps its own offset; a Binary takes its left operand's.
  auto grouped = parse_ok("(a + b) * c");
  CHECK(grouped->offset == 1);
  CHECK(grouped->args[1]->offset == 10);
}

TEST_CASE("expr: error messages and offsets") {
  check_single_error("softmax(x", 9, "expected ')' to close the call to 'softmax' opened at column 1");
  check_single_error("y + softmax(f(x), axis=-1", 25, "expected ')' to close the call to 'softmax' opened at column 5");
  check_single_error("a $ b", 2, "unexpected character '$'");
  check_single_error("'abc", 0, "unterminated string");
  check_single_error("f(\"abc)", 2, "unterminated string");
  check_single_error("\"abc\\", 0, "unterminated string");
  check_single_error("a +", 3, "expected an expression after '+'");
  check_single_error("a + * b", 4, "expected an expression after '+'");
  check_single_error("2 **", 4, "expected an expression after '**'");
  check_single_error("-", 1, "expected an expression after '-'");
  check_single_error("f(axis=-1, x)", 11, "positional argument after keyword argument 'axis'");
  // A malformed argument after a keyword says so, rather than "positional argument".
  check_single_error("f(axis=-1, x y)", 13, "expected ',' or ')'");
  check_single_error("a = b", 2, "'=' is not an operator here: did you mean '=='?");
  check_single_error("f(x + 1 = 2)", 8, "did you mean '=='?");
  check_single_error("f(a b)", 4, "expected ',' or ')' in the call to 'f' opened at column 1, found 'b'");
  check_single_error("", 0, "empty expression");
  check_single_error("   ", 3, "empty expression");
  check_single_error(")", 0, "expected an expression, found ')'");
  check_single_error("(a + b", 6, "expected ')' to close the '(' opened at column 1");
  check_single_error("(a b)", 3, "expected ')' to close the '(' opened at column 1, found 'b'");
  check_single_error("()", 1, "expected an expression after '('");
  check_single_error("[1, 2", 5, "expected ']' to close the list opened at column 1");
  check_single_error("[1 2]", 3, "expected ',' or ']' in the list opened at column 1, found '2'");
  check_single_error("x[0", 3, "expected ']' to close the subscript opened at column 2");
  check_single_error("x[]", 2, "empty subscript");
  check_single_error("x[::2]", 3, "slice steps");
  check_single_error("x[1:2:3]", 5, "slice steps");
  check_single_error("a b", 2, "expected an operator or the end of the expression, found 'b'");
  check_single_error("a \"s\"", 2, "found a string");
  check_single_error("a)", 1, "unmatched ')'");
  check_single_error("a]", 1, "unmatched ']'");
  check_single_error("a, b", 1, "unexpected ','");
  check_single_error("a : b", 2, "':' is only allowed in a subscript");
  check_single_error("f(x)(y)", 4, "only a function name can be called");
  check_single_error("2(3)", 1, "only a function name can be called");
  check_single_error("3d", 0, "invalid number '3d'; to multiply, write '3*d'");
  check_single_error("1.2.3", 0, "invalid number '1.2.3'");
  check_single_error("1e", 0, "invalid number '1e'");
  check_single_error("2 * 0x10", 4, "invalid number '0x10'");
  check_single_error("1e999", 0, "number '1e999' is out of range");
  check_single_error("x.", 0, "invalid name 'x.'");
  check_single_error("a..b", 0, "invalid name 'a..b'");
  check_single_error("f(axis=)", 7, "expected a value after 'axis='");
  check_single_error("f(axis=1, axis=2)", 10, "keyword argument 'axis' given twice");
  check_single_error("f(a.b=1)", 2, "keyword argument name 'a.b' cannot contain '.'");
  check_single_error("'a\\qb'", 2, "unknown escape '\\q' in string");
  check_single_error("a < b < c", 6, "comparisons cannot be chained");
  check_single_error("a == b != c", 7, "comparisons cannot be chained");
  check_single_error("!x", 0, "unexpected character '!'");
  check_single_error("a \xC3\x97 b", 2, "unexpected character '\xC3\x97'");  // U+00D7 multiplication sign
  check_single_error("a \x01", 2, "unexpected character '\\x01'");
  check_single_error("f(a, b", 6, "expected ')' to close the call to 'f'");
  check_single_error("f(,)", 2, "expected an expression after '('");
  check_single_error("[1, (2", 6, "expected ')' to close the '(' opened at column 5");
  check_single_error("f(a]", 3, "expected ',' or ')' in the call to 'f' opened at column 1, found ']'");
}

TEST_CASE("expr: several independent errors are all reported, in order") {
  // f(a +, b $ c, d=)
  // 0    5   9     16
  ParseResult r = parse_expression("f(a +, b $ c, d=)");
  INFO(messages(r));
  CHECK_FALSE(r.expr);
  REQUIRE(r.errors.size() == 3);
  CHECK(r.errors[0].offset == 5);
  CHECK(r.errors[0].message.find("expected an expression after '+'") != std::string::npos);
  CHECK(r.errors[1].offset == 9);
  CHECK(r.errors[1].message.find("unexpected character '$'") != std::string::npos);
  CHECK(r.errors[2].offset == 16);
  CHECK(r.errors[2].message.find("expected a value after 'd='") != std::string::npos);

  ParseResult lexical = parse_expression("a $ b # c");
  REQUIRE(lexical.errors.size() == 2);
  CHECK(lexical.errors[0].offset == 2);
  CHECK(lexical.errors[1].offset == 6);

  // An error inside a call does not hide a later one outside it.
  ParseResult outer = parse_expression("f(a +) + * 2");
  REQUIRE(outer.errors.size() == 2);
  CHECK(outer.errors[0].offset == 5);
  CHECK(outer.errors[1].offset == 9);

  // Recovery skips the rest of a bad item, brackets it opened included.
  struct Case {
    const char* source;
    std::vector<int> offsets;
  };
  for (const Case& c : {Case{"[1, 2, (3 4), 5 6]", {10, 16}}, Case{"f((a b), [c d], e f)", {5, 12, 18}},
                        Case{"[(), 1]", {2}}, Case{"f(a], b c)", {3, 8}}, Case{"[f(a], 2]", {4}},
                        Case{"[f(a +], 2 3]", {6, 11}}, Case{"f(a + (b, c)", {8}}, Case{"[x[], 2 3]", {3, 8}}}) {
    ParseResult recovered = parse_expression(c.source);
    INFO(c.source, "\n", messages(recovered));
    std::vector<int> offsets;
    for (const ParseError& e : recovered.errors) offsets.push_back(e.offset);
    CHECK(offsets == c.offsets);
  }

  ParseResult lists = parse_expression("[x[], [1 2], f(axis=1, 3)]");
  INFO(messages(lists));
  REQUIRE(lists.errors.size() == 3);
  CHECK(lists.errors[0].message.find("empty subscript") != std::string::npos);
  CHECK(lists.errors[1].offset == 9);
  CHECK(lists.errors[2].message.find("positional argument after keyword argument 'axis'") != std::string::npos);
}

TEST_CASE("expr: nesting and length limits") {
  std::string deep_ok = std::string(150, '(') + "x" + std::string(150, ')');
  CHECK(parse_ok(deep_ok)->kind == ExprKind::Name);
  check_single_error(std::string(300, '(') + "x" + std::string(300, ')'), 200, "nested too deeply");
  check_single_error(std::string(300, '-') + "x", 200, "nested too deeply");
  check_single_error(std::string(300, '[') + std::string(300, ']'), 200, "nested too deeply");

  std::string long_chain = "x";
  for (int i = 0; i < 450; ++i) long_chain += " + x";
  auto chain = parse_ok(long_chain);
  CHECK(to_string(*chain) == long_chain);

  std::string too_long = "x";
  for (int i = 0; i < 600; ++i) too_long += " + x";
  check_single_error(too_long, 0, "expression is too long (more than 1000 tokens)");
}

TEST_CASE("expr: to_string is canonical with minimal parentheses") {
  CHECK(canonical("a+b*c") == "a + b * c");
  CHECK(canonical("(a+b)*c") == "(a + b) * c");
  CHECK(canonical("((a))") == "a");
  CHECK(canonical("-(x**2)") == "-x ** 2");
  CHECK(canonical("(-x)**2") == "(-x) ** 2");
  CHECK(canonical("a-(b-c)") == "a - (b - c)");
  CHECK(canonical("(a-b)-c") == "a - b - c");
  CHECK(canonical("a**(b**c)") == "a ** b ** c");
  CHECK(canonical("(a**b)**c") == "(a ** b) ** c");
  CHECK(canonical("2**-x") == "2 ** -x");
  CHECK(canonical("-(a+b)") == "-(a + b)");
  CHECK(canonical("-(-x)") == "--x");
  CHECK(canonical("(a == b) == c") == "(a == b) == c");
  CHECK(canonical("a == (b == c)") == "a == (b == c)");
  CHECK(canonical("(a < b) + 1") == "(a < b) + 1");
  CHECK(canonical("a * (b / c)") == "a * (b / c)");
  CHECK(canonical("(a+b)[0]") == "(a + b)[0]");
  CHECK(canonical("x[ : , 0 ]") == "x[:, 0]");
  CHECK(canonical("x[1:]") == "x[1:]");
  CHECK(canonical("f( a , b = 1 , )") == "f(a, b=1)");
  CHECK(canonical("[1,[2],]") == "[1, [2]]");
  CHECK(canonical("3e-4") == "3e-4");
  CHECK(canonical("1E5") == "1e5");
  CHECK(canonical("1e20") == "1e20");
  CHECK(canonical("0.02") == "0.02");
  CHECK(canonical(".5") == "0.5");
  CHECK(canonical("5.") == "5.0");
  CHECK(canonical("007") == "7");
  CHECK(canonical("123456789012345678901234567890") == "123456789012345677877719597056");
  CHECK(canonical(R"('it\'s' + "a\\b\n")") == R"("it's" + "a\\b\n")");
}

TEST_CASE("expr: to_string parenthesizes a negative literal built by a later pass") {
  auto e = parse_ok("x ** 2");
  e->args[0]->kind = ExprKind::Number;
  e->args[0]->number = -1;
  e->args[0]->is_integer = true;
  CHECK(to_string(*e) == "(-1) ** 2");
}

TEST_CASE("expr: round trip parse(to_string(parse(s)))") {
  const char* sources[] = {
      "softmax(causal_mask(einsum(q, k, \"b h i hd, b h j hd -> b h i j\") / sqrt(head_dim)), axis=-1)",
      "x + einsum(y, w, \"b s e, e d -> b s d\") + b",
      "normal(0.02)",
      "adamw(lr=3e-4, betas=[0.9, 0.95], no_decay=[\"*_b\", 'ln*'])",
      "d / heads",
      "3*d",
      "(d // 2) + 1",
      "x[0]",
      "x[1:3]",
      "x[:, 0]",
      "-x**2",
      "a @ b",
      "x > 0",
      "1e-5",
      ".5",
      "a - (b - c) - -d",
      "(a + b) * (c - d) / (e % f)",
      "-(a ** -b) ** c",
      "(-a) ** (b ** c)",
      "((a < b) == (c >= d)) != e",
      "f()[0][1:][:2, x + 1]",
      "blocks.3.w @ x",
      "[[], [1], 'q\"uote', \"tab\\there\"]",
      "+-+x",
      "0.1 + 0.2 * 3e300 - 4.9e-324",
  };
  for (const char* source : sources) {
    INFO(source);
    auto first = parse_ok(source);
    std::string text = to_string(*first);
    auto second = parse_ok(text);
    CHECK(sexpr(*second) == sexpr(*first));
    CHECK(to_string(*second) == text);
  }
}

TEST_CASE("targets: names with offsets") {
  TargetList t = parse_targets("q, k, v");
  CHECK(t.errors.empty());
  REQUIRE(t.names.size() == 3);
  CHECK(t.names[0] == std::pair<std::string, int>{"q", 0});
  CHECK(t.names[1] == std::pair<std::string, int>{"k", 3});
  CHECK(t.names[2] == std::pair<std::string, int>{"v", 6});

  TargetList single = parse_targets("  out ");
  CHECK(single.errors.empty());
  REQUIRE(single.names.size() == 1);
  CHECK(single.names[0] == std::pair<std::string, int>{"out", 2});

  TargetList tight = parse_targets("a,b_2,blocks.0.h");
  CHECK(tight.errors.empty());
  REQUIRE(tight.names.size() == 3);
  CHECK(tight.names[2] == std::pair<std::string, int>{"blocks.0.h", 6});
}

TEST_CASE("targets: errors") {
  struct Case {
    const char* source;
    int offset;
    const char* text;
  };
  for (Case c : {Case{"", 0, "empty target list"}, Case{"  ", 2, "empty target list"},
                 Case{"q, 3", 3, "expected a name in the target list, found '3'"},
                 Case{"q, k, k", 6, "'k' assigned twice in one target list"},
                 Case{"q k", 2, "expected ',' between target names, found 'k'"},
                 Case{"q,", 2, "expected a name after ','"}, Case{", q", 0, "expected a name before ','"},
                 Case{"q,,k", 2, "expected a name after ','"}, Case{"q, $", 3, "unexpected character '$'"},
                 Case{"f(x)", 1, "expected ',' between target names, found '('"},
                 Case{"q, \"s\"", 3, "found a string"}, Case{"x.", 0, "invalid name 'x.'"}}) {
    TargetList t = parse_targets(c.source);
    INFO(c.source);
    REQUIRE(t.errors.size() == 1);
    CHECK(t.errors[0].offset == c.offset);
    CHECK(t.errors[0].message.find(c.text) != std::string::npos);
  }

  TargetList many = parse_targets("a, 1, a, b c");
  REQUIRE(many.errors.size() == 3);
  CHECK(many.errors[0].offset == 3);
  CHECK(many.errors[1].offset == 6);
  CHECK(many.errors[2].offset == 11);
}
