// Tests for einops pattern parsing (frontend/einops_pattern.h).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "frontend/einops_pattern.h"

using namespace napkin::frontend;

namespace {

// A side as text: plain axes by name, "1" for a size-one axis, groups in parentheses.
std::string side_text(const PatternSide& side) {
  std::string out;
  for (const PatternAxis& axis : side.axes) {
    if (!out.empty()) out += ' ';
    std::string names;
    for (const std::string& n : axis.names) names += (names.empty() ? "" : " ") + n;
    out += axis.is_group ? "(" + names + ")" : (axis.names.empty() ? "1" : names);
  }
  return out;
}

std::string pattern_text(const Pattern& p) {
  std::string out;
  for (size_t i = 0; i < p.inputs.size(); ++i) out += (i ? ", " : "") + side_text(p.inputs[i]);
  return out + " -> " + side_text(p.output);
}

std::string messages(const PatternResult& r) {
  std::string all;
  for (const auto& e : r.errors) all += "  @" + std::to_string(e.offset) + ": " + e.message + "\n";
  return all;
}

Pattern parse_ok(const std::string& source) {
  PatternResult r = parse_pattern(source);
  INFO("pattern: ", source, "\nerrors:\n", messages(r));
  REQUIRE(r.ok());
  return r.pattern;
}

// Exactly one error, at `offset`, mentioning `text`.
void check_single_error(const std::string& source, int offset, const std::string& text) {
  PatternResult r = parse_pattern(source);
  INFO("pattern: ", source, "\nerrors:\n", messages(r));
  CHECK_FALSE(r.ok());
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].offset == offset);
  CHECK(r.errors[0].message.find(text) != std::string::npos);
}

}  // namespace

TEST_CASE("einops: einsum pattern with two operands") {
  Pattern p = parse_ok("b h i d, b h j d -> b h i j");
  REQUIRE(p.inputs.size() == 2);
  CHECK(side_text(p.inputs[0]) == "b h i d");
  CHECK(side_text(p.inputs[1]) == "b h j d");
  CHECK(side_text(p.output) == "b h i j");
  CHECK(p.inputs[0].offset == 0);
  CHECK(p.inputs[1].offset == 9);
  CHECK(p.output.offset == 20);
  REQUIRE(p.inputs[1].axes.size() == 4);
  CHECK(p.inputs[1].axes[2].names == std::vector<std::string>{"j"});
  CHECK(p.inputs[1].axes[2].offset == 13);
  CHECK_FALSE(p.inputs[1].axes[2].is_group);
}

TEST_CASE("einops: groups") {
  Pattern split = parse_ok("b s (three h d) -> three b h s d");
  REQUIRE(split.inputs.size() == 1);
  REQUIRE(split.inputs[0].axes.size() == 3);
  const PatternAxis& group = split.inputs[0].axes[2];
  CHECK(group.is_group);
  CHECK(group.names == std::vector<std::string>{"three", "h", "d"});
  CHECK(group.offset == 4);
  CHECK(side_text(split.output) == "three b h s d");

  Pattern merge = parse_ok("(b s) d -> b s d");
  CHECK(pattern_text(merge) == "(b s) d -> b s d");
  CHECK(merge.inputs[0].axes[0].offset == 0);
  CHECK(merge.inputs[0].axes[1].offset == 6);

  CHECK(pattern_text(parse_ok("b s h d -> b s (h d)")) == "b s h d -> b s (h d)");
  CHECK(pattern_text(parse_ok("(a) b -> a b")) == "(a) b -> a b");

  Pattern empty_group = parse_ok("() h -> h");
  CHECK(empty_group.inputs[0].axes[0].is_group);
  CHECK(empty_group.inputs[0].axes[0].names.empty());
  CHECK(pattern_text(empty_group) == "() h -> h");
  CHECK(pattern_text(parse_ok("(a b)c -> a(b c)")) == "(a b) c -> a (b c)");
}

TEST_CASE("einops: reductions, size-one axes and permutations") {
  CHECK(pattern_text(parse_ok("b s d -> b s")) == "b s d -> b s");
  CHECK(pattern_text(parse_ok("a b -> b a")) == "a b -> b a");

  Pattern one = parse_ok("1 d -> d");
  REQUIRE(one.inputs[0].axes.size() == 2);
  CHECK(one.inputs[0].axes[0].names.empty());
  CHECK_FALSE(one.inputs[0].axes[0].is_group);
  CHECK(pattern_text(parse_ok("d -> 1 d 1")) == "d -> 1 d 1");
}

TEST_CASE("einops: empty output is a scalar") {
  Pattern full = parse_ok("b s d ->");
  CHECK(full.output.axes.empty());
  CHECK(full.output.offset == 8);
  Pattern dot = parse_ok("i, i ->");
  CHECK(dot.inputs.size() == 2);
  CHECK(dot.output.axes.empty());
  CHECK(parse_ok("a,b->").inputs.size() == 2);
}

TEST_CASE("einops: whitespace and names") {
  CHECK(pattern_text(parse_ok("  a\tb\n->  b a ")) == "a b -> b a");
  CHECK(pattern_text(parse_ok("a b->b a")) == "a b -> b a");
  CHECK(pattern_text(parse_ok("head_dim h2 _x -> _x h2 head_dim")) == "head_dim h2 _x -> _x h2 head_dim");
  CHECK(pattern_text(parse_ok("b i, b j -> b i j")) == "b i, b j -> b i j");  // names shared across operands
  CHECK(parse_ok("a, b, c, d -> a b c d").inputs.size() == 4);
}

TEST_CASE("einops: arrow errors") {
  check_single_error("a b c", 5, "an einops pattern needs '->' between inputs and output");
  check_single_error("", 0, "needs '->'");
  check_single_error("a -> b -> c", 7, "only one '->' is allowed in a pattern");
  check_single_error("a - b", 2, "'-' must be followed by '>'");
  check_single_error("a > b", 2, "'>' must follow '-'");
  check_single_error("a b \xE2\x86\x92 b a", 4, "is not an arrow here: write '->'");  // U+2192

  PatternResult three = parse_pattern("a -> b -> c -> d");
  REQUIRE(three.errors.size() == 2);
  CHECK(three.errors[0].offset == 7);
  CHECK(three.errors[1].offset == 12);
  CHECK(three.errors[1].message.find("only one '->' is allowed") != std::string::npos);
  CHECK(side_text(three.pattern.output) == "b");
}

TEST_CASE("einops: parenthesis errors") {
  check_single_error("(a (b c)) -> a", 3, "nested parentheses are not allowed in einops patterns");
  check_single_error("(a b -> a", 0, "'(' at column 1 is never closed");
  check_single_error("a (b -> a", 2, "'(' at column 3 is never closed");
  check_single_error("a b -> (a b", 7, "never closed");
  check_single_error("a b) -> a", 3, "unmatched ')'");
  check_single_error("a -> a)", 6, "unmatched ')'");
  check_single_error("(1 a) -> a", 1, "'1' cannot appear inside a group");
  check_single_error("(a, b) -> a", 2, "',' cannot appear inside a group");
  // Without a ')' ahead, the group ends at the ',' and the next operand parses normally.
  check_single_error("(a b, c -> a", 0, "never closed");
}

TEST_CASE("einops: operand errors") {
  check_single_error("a, , b -> a", 3, "operand 2 has no axes");
  check_single_error("a, -> a", 3, "operand 2 has no axes");
  check_single_error("-> b", 0, "operand 1 has no axes");
  check_single_error(", a -> a", 0, "operand 1 has no axes");
  check_single_error("a, b -> a, b", 9, "the output must be a single operand");
  check_single_error("a b -> a,", 8, "the output must be a single operand");
}

TEST_CASE("einops: axis errors") {
  check_single_error("a $ b -> a", 2, "unexpected character '$'");
  check_single_error("a \xE2\x80\xA6 -> a", 2, "unexpected character '\xE2\x80\xA6'");  // U+2026 ellipsis
  check_single_error("a . -> a", 2, "unexpected character '.'");
  check_single_error("a ... -> a", 2, "'...' is not supported: napkin shapes are static; name every axis");
  check_single_error("... a -> a", 0, "'...' is not supported");
  check_single_error("a d d -> a", 4, "axis 'd' appears twice in operand 1");
  check_single_error("a b, c c -> a", 7, "axis 'c' appears twice in operand 2");
  check_single_error("a b -> a a", 9, "axis 'a' appears twice in the output");
  check_single_error("(a a) -> a", 3, "axis 'a' appears twice in operand 1");
  check_single_error("a (b a) -> a", 5, "axis 'a' appears twice in operand 1");
  check_single_error("2 a -> a", 0, "'2' is not an axis: the only number allowed is 1");
  check_single_error("01 a -> a", 0, "'01' is not an axis");
  check_single_error("a -> a 3", 7, "'3' is not an axis");
  check_single_error("2h -> h", 0, "invalid axis name '2h'");
  check_single_error("a.b -> a", 1, "unexpected character '.'");
}

TEST_CASE("einops: several independent errors, sorted by offset") {
  PatternResult r = parse_pattern("a a $ -> b b, c");
  INFO(messages(r));
  REQUIRE(r.errors.size() == 4);
  CHECK(r.errors[0].offset == 2);
  CHECK(r.errors[0].message.find("appears twice in operand 1") != std::string::npos);
  CHECK(r.errors[1].offset == 4);
  CHECK(r.errors[2].offset == 11);
  CHECK(r.errors[2].message.find("appears twice in the output") != std::string::npos);
  CHECK(r.errors[3].offset == 12);
}
