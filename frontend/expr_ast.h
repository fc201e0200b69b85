// The syntax tree of one expression string from a model file, e.g.
//   softmax(causal_mask(scores) / sqrt(head_dim), axis=-1)
// Every node records its byte offset inside the expression string so that
// diagnostics can point at the exact column in the YAML file.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace napkin::frontend {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct KeywordArg {
  std::string name;
  ExprPtr value;
  int offset = 0;  // offset of the keyword name
};

enum class ExprKind {
  Number,     // 3, 0.02, 3e-4          (number, is_integer)
  String,     // "b s d, d e -> b s e"  (text, without quotes)
  Name,       // x, head_dim, fp32      (text)
  Call,       // f(a, b, key=value)     (text = callee name, args, kwargs)
  Unary,      // -x                     (text = "-", args[0])
  Binary,     // a + b                  (text = operator, args[0], args[1])
  List,       // [a, b]                 (args)
  Subscript,  // x[0], x[1:3], x[:, 2]  (args[0] = base, slices)
};

// One subscript component: an index (x[2]) or a slice (x[1:3], x[:]).
struct SliceItem {
  bool is_slice = false;  // false: `start` is an index
  ExprPtr start;          // may be null for a slice (x[:3])
  ExprPtr stop;           // may be null (x[1:])
  int offset = 0;
};

struct Expr {
  ExprKind kind;
  int offset = 0;  // byte offset of the node's first character in the expression string
  int op_offset = 0;  // Unary, Binary: byte offset of the operator token (where a shape error points)
  std::string text;
  double number = 0;
  bool is_integer = false;  // the literal had no '.', 'e' or 'E'
  std::vector<ExprPtr> args;
  std::vector<KeywordArg> kwargs;
  std::vector<SliceItem> slices;
};

// Binary operators, lowest precedence first:
//   ==  !=  <  <=  >  >=     (comparison, non-associative)
//   +  -                     (left-assoc)
//   *  /  //  %  @           (left-assoc; @ is matmul, // floor division for dim expressions)
//   unary -  +
//   **                       (right-assoc, binds tighter than unary minus: -x**2 == -(x**2))
//   postfix: call f(...), subscript x[...]
// Operator text in Expr::text is exactly the token ("+", "//", "**", "@", "<=", ...).

struct ParseError {
  int offset = 0;  // byte offset inside the expression string
  std::string message;
};

struct ParseResult {
  ExprPtr expr;                    // null iff error is set
  std::vector<ParseError> errors;  // at least one when expr is null
};

// Parses a whole expression string; trailing garbage is an error.
ParseResult parse_expression(const std::string& source);

// Parses "a, b, c" (an assignment target list) into names with offsets.
// Returns an error for anything but comma-separated identifiers.
struct TargetList {
  std::vector<std::pair<std::string, int>> names;  // name, offset
  std::vector<ParseError> errors;
};
TargetList parse_targets(const std::string& source);

// Renders an expression back to canonical text (used in IR comments and tests).
std::string to_string(const Expr& e);

}  // namespace napkin::frontend
