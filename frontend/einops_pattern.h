// Parsing of einops-style pattern strings, shared by einsum, rearrange and reduce.
//
//   einsum:    "b h i d, b h j d -> b h i j"         (1..n operands, no groups)
//   rearrange: "b s (three h d) -> three b h s d"    (groups on either side, "1" allowed)
//   reduce:    "b s d -> b s"                         (axes missing on the right are reduced)
//
// Axis names are identifiers ([A-Za-z_][A-Za-z0-9_]*). A group "(a b c)" is one
// tensor axis made of several pattern axes (outermost first). A lone "1" is an
// axis of size one (rearrange only). "..." is not supported: napkin shapes are static,
// so name every axis. Errors carry a byte offset into the pattern string.
#pragma once

#include <string>
#include <vector>

namespace napkin::frontend {

// One tensor axis as written in a pattern: a single name, a group, or "1".
struct PatternAxis {
  std::vector<std::string> names;  // one name for a plain axis; several for a group; empty for "1"
  bool is_group = false;           // written with parentheses (even "(a)" or "()")
  int offset = 0;                  // offset of the axis (or '(') in the pattern string
};

// One side of a pattern for one operand: the list of tensor axes.
struct PatternSide {
  std::vector<PatternAxis> axes;
  int offset = 0;
};

struct Pattern {
  std::vector<PatternSide> inputs;  // comma-separated operands left of "->"
  PatternSide output;
};

struct PatternError {
  int offset = 0;
  std::string message;
};

struct PatternResult {
  Pattern pattern;
  std::vector<PatternError> errors;  // empty on success
  bool ok() const { return errors.empty(); }
};

// Syntax only: arrows, commas, parentheses, names. Each name may appear at most
// once per side (an error names the repeated axis). Semantic checks (axis sizes,
// which names appear where) belong to the op that uses the pattern.
PatternResult parse_pattern(const std::string& pattern);

}  // namespace napkin::frontend
