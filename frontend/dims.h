// Named dimensions: `dims:` maps names to positive integers or to integer
// expressions of other dims (`head_dim: d / heads`). Division must be exact
// ('/' checks it; '//' floors on purpose). Order in the file does not matter;
// cycles are errors. Values given on the command line (LoadOptions::dim_overrides)
// replace the file's expressions; messages about values derived from them say so.
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "frontend/expr_ast.h"
#include "frontend/yaml_context.h"
#include "ir/type.h"

namespace napkin::frontend {

struct DimTable {
  std::map<std::string, int64_t> sizes;
  std::map<std::string, ir::SourceLoc> locs;
  std::vector<std::string> order;  // as written in the file
  std::set<std::string> failed;     // declared but in error (reported once, then silent)
  // The overrides in effect (name -> value), and for each resolved dim the
  // overridden dims its value comes from (itself, if it is overridden).
  std::map<std::string, int64_t> overrides;
  std::map<std::string, std::set<std::string>> from_overrides;
  bool has(const std::string& n) const { return sizes.count(n) > 0; }
};

// Dims must stay below this (no tensor axis is near it), so arithmetic on them cannot overflow.
constexpr int64_t kMaxDimValue = int64_t{1} << 48;

// Reads dims:, with `overrides` in place of the expressions of the dims they
// name. An override of a dim the file does not declare, or of a value out of
// range, is reported at file:1:1.
DimTable read_dims(const YAML::Node& dims, YamlContext& ctx, const std::map<std::string, int64_t>& overrides = {});

// " (with d=30, heads=4 from --dims)" if the value of `e` depends on overridden
// dims, else "": appended to messages about values, so that a user sees that a
// size they did not write is the cause.
std::string override_note(const Expr& e, const DimTable& dims);

// Evaluates an integer expression of dims and integer literals (+ - * / // % **,
// parentheses). Reports errors at `base` shifted by each node's offset.
std::optional<int64_t> eval_dim_expr(const Expr& e, const DimTable& dims, const ir::SourceLoc& base,
                                     ir::Diagnostics& diag);

// Reads a shape list such as [batch, seq] or [d, 3*d]; each entry must be a
// positive integer. The dims keep the names written ("d", "3*d").
std::optional<std::vector<ir::Dim>> read_shape(const YAML::Node& shape, const DimTable& dims,
                                               YamlContext& ctx, const std::string& what);

// How read_declaration reads an entry of inputs: or params:.
struct DeclarationRules {
  // Its dtype must be floating-point (a parameter: gradients train it). The
  // default dtype is f32 either way.
  bool floating_only = false;
  // One more key it must have (a parameter's init:, read by the caller), and
  // the hint when it is missing; "" for none.
  std::string needs;
  std::string needs_hint;
};

// Reads the `{shape: [...], dtype: ...}` mapping `spec` of the input or
// parameter `key` (`what`: "input 'x'"). Every mistake is reported once and
// gives nullopt; a missing key after a misspelled one ("shpe") is not reported
// again. Shape and dtype are both read even when one of them is wrong.
std::optional<ir::TensorType> read_declaration(const YAML::Node& key, const YAML::Node& spec,
                                               const std::string& what, const DimTable& dims, YamlContext& ctx,
                                               const DeclarationRules& rules = {});

}  // namespace napkin::frontend
