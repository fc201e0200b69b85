#include "frontend/dims.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "frontend/frontend.h"
#include "frontend/suggest.h"
#include "ir/builder.h"

namespace napkin::frontend {

namespace {

// The names eval_dim_expr looks up in `e`, left to right: it reads names through unary and
// binary operators only (anything else is an error there, its operands unread).
void dim_refs(const Expr& e, std::vector<const Expr*>& out) {
  if (e.kind == ExprKind::Name) out.push_back(&e);
  if (e.kind == ExprKind::Unary || e.kind == ExprKind::Binary)
    for (const ExprPtr& arg : e.args) dim_refs(*arg, out);
}

// The overridden dims that the value of `e` comes from.
std::set<std::string> overrides_in(const Expr& e, const DimTable& dims) {
  std::set<std::string> out;
  if (dims.overrides.empty()) return out;
  std::vector<const Expr*> refs;
  dim_refs(e, refs);
  for (const Expr* r : refs)
    if (auto it = dims.from_overrides.find(r->text); it != dims.from_overrides.end())
      out.insert(it->second.begin(), it->second.end());
  return out;
}

// The size of the dim `name` refers to. An unknown name is reported at its
// use; a failed dim is silent (its own error is reported).
std::optional<int64_t> lookup(const Expr& name, const DimTable& dims, const ir::SourceLoc& base,
                              ir::Diagnostics& diag) {
  if (auto it = dims.sizes.find(name.text); it != dims.sizes.end()) return it->second;
  if (dims.failed.count(name.text)) return std::nullopt;
  diag.error(base.shifted(name.offset),
             fmt::format("unknown dim '{}'{}", name.text, did_you_mean(name.text, dims.order)),
             dims.order.empty() ? "declare it under dims:"
                                : fmt::format("declared dims: {}", fmt::join(dims.order, ", ")));
  return std::nullopt;
}

}  // namespace

std::string override_note(const Expr& e, const DimTable& dims) {
  std::set<std::string> names = overrides_in(e, dims);
  if (names.empty()) return "";
  std::vector<std::string> parts;
  for (const std::string& n : names) parts.push_back(fmt::format("{}={}", n, dims.overrides.at(n)));
  return fmt::format(" (with {} from --dims)", fmt::join(parts, ", "));
}

std::optional<int64_t> eval_dim_expr(const Expr& e, const DimTable& dims, const ir::SourceLoc& base,
                                     ir::Diagnostics& diag) {
  auto fail = [&](const Expr& at, std::string msg, std::string hint = "") -> std::optional<int64_t> {
    diag.error(base.shifted(at.offset), std::move(msg), std::move(hint));
    return std::nullopt;
  };
  // A failure that depends on the values: it names the overrides they come from.
  auto fail_value = [&](const Expr& at, std::string msg, std::string hint = "") -> std::optional<int64_t> {
    return fail(at, msg + override_note(at, dims), std::move(hint));
  };
  // Dim arithmetic stays far below int64 overflow: no tensor axis is anywhere
  // near 2^48 elements, and a bigger value is surely a mistake.
  constexpr int64_t kLimit = kMaxDimValue;
  auto bounded = [&](const Expr& at, __int128 v) -> std::optional<int64_t> {
    if (v > kLimit || v < -kLimit)
      return fail_value(at, fmt::format("'{}' is out of range: dims must stay below 2^48", to_string(at)),
                        "no tensor axis is that large; check the expression");
    return static_cast<int64_t>(v);
  };
  switch (e.kind) {
    case ExprKind::Number:
      // 2e3 is a whole number written in floating-point notation: accept it.
      if (!e.is_integer && e.number != std::floor(e.number))
        return fail(e, fmt::format("dims must be whole numbers, got {}", to_string(e)), "use a whole number");
      if (e.number > static_cast<double>(kLimit))
        return fail(e, fmt::format("{} is out of range: dims must stay below 2^48", to_string(e)),
                    "no tensor axis is that large; check the value");
      return static_cast<int64_t>(e.number);
    case ExprKind::Name:
      return lookup(e, dims, base, diag);
    case ExprKind::Unary: {
      auto v = eval_dim_expr(*e.args[0], dims, base, diag);
      if (!v) return v;
      return e.text == "-" ? -*v : *v;
    }
    case ExprKind::Binary: {
      auto a = eval_dim_expr(*e.args[0], dims, base, diag);
      auto b = eval_dim_expr(*e.args[1], dims, base, diag);
      if (!a || !b) return std::nullopt;
      const std::string& op = e.text;
      __int128 x = *a, y = *b;
      if (op == "+") return bounded(e, x + y);
      if (op == "-") return bounded(e, x - y);
      if (op == "*") return bounded(e, x * y);
      if (op == "**") {
        if (y < 0) return fail_value(e, "a dim power must not be negative");
        // The loop below ends once |r| passes the limit, which a base of 0, 1 or -1
        // never does: 1 ** (2 ** 48) would loop 2^48 times. Their powers are known.
        if (x == 0) return y == 0 ? 1 : 0;
        if (x == 1 || x == -1) return x == -1 && y % 2 != 0 ? -1 : 1;
        __int128 r = 1;
        for (__int128 i = 0; i < y; ++i) {
          r *= x;
          if (r > kLimit || r < -kLimit) return bounded(e, r);
        }
        return bounded(e, r);
      }
      if (op == "/" || op == "//" || op == "%") {
        if (y == 0) return fail_value(*e.args[1], fmt::format("division by zero in '{}'", to_string(e)));
        if (op == "/" && x % y != 0)
          return fail_value(e,
                            fmt::format("'{}' is {} / {}, which does not divide exactly", to_string(e), *a, *b),
                            "choose sizes that divide, or write '//' to round down on purpose");
        // Python semantics: // floors and % takes the divisor's sign.
        __int128 q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        if (op == "%") return bounded(e, x - q * y);
        return bounded(e, q);
      }
      return fail(e, fmt::format("'{}' is not allowed in a dim expression", op),
                  "dims use + - * / // % ** and parentheses");
    }
    default:
      return fail(e, fmt::format("'{}' is not a dim expression", to_string(e)),
                  "dims use integers, other dims, + - * / // % ** and parentheses");
  }
}

namespace {

// Checks the overrides against the declared dims (file-level errors, at 1:1)
// and enters the valid ones into the table.
void apply_overrides(const std::map<std::string, int64_t>& overrides, DimTable& table, YamlContext& ctx) {
  const ir::SourceLoc at{ctx.file(), 1, 1};
  for (const auto& [name, value] : overrides) {
    if (!table.locs.count(name)) {
      ctx.diag().error(at,
                       fmt::format("--dims sets '{}', but the model has no such dim{}", name,
                                   did_you_mean(name, table.order)),
                       table.order.empty() ? "the model declares no dims: it has nothing to override"
                                           : fmt::format("declared dims: {}", fmt::join(table.order, ", ")));
      continue;
    }
    table.overrides[name] = value;  // even when bad: its uses stay silent below
    if (value < 1 || value > kMaxDimValue) {
      ctx.diag().error(at,
                       value < 1 ? fmt::format("--dims sets '{}' to {}, but a dim must be positive", name, value)
                                 : fmt::format("--dims sets '{}' to {}, but dims must stay below 2^48", name, value),
                       "every dim is the size of a tensor axis: give a value from 1 up");
      table.failed.insert(name);
      continue;
    }
    table.sizes[name] = value;
    table.from_overrides[name] = {name};
  }
}

}  // namespace

DimTable read_dims(const YAML::Node& node, YamlContext& ctx, const std::map<std::string, int64_t>& overrides) {
  DimTable table;
  // A dims: section that is not a mapping is reported; overrides of it would only repeat that.
  if (node && !node.IsNull() && !ctx.check_mapping(node, "dims")) return table;
  struct Pending {
    ExprPtr expr;
    ir::SourceLoc base;
  };
  std::map<std::string, Pending> pending;
  if (node && !node.IsNull()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      std::string name = it->first.Scalar();
      if (pending.count(name)) continue;  // duplicate: reported by check_keys
      table.order.push_back(name);
      table.locs[name] = ctx.loc(it->first);
      // An overridden dim's expression is still parsed (a syntax error is the file's
      // mistake) but never evaluated: the override stands in its place.
      pending[name] = {ctx.parse_scalar_expr(it->second, fmt::format("dim '{}'", name)), ctx.text_loc(it->second)};
    }
  }
  apply_overrides(overrides, table, ctx);
  // Each dim is evaluated after the dims it refers to, found by a depth-first walk
  // with an explicit stack: resolving them by recursion through eval_dim_expr overflowed
  // the call stack on a chain of 30000 dims (d0: d1, d1: d2, ...).
  std::set<std::string> in_progress;
  std::vector<std::string> stack;  // the names in progress, outermost first (for cycle messages)
  struct Frame {
    std::string name;
    std::vector<const Expr*> refs;  // the names its expression looks up, in order
    size_t next = 0;
  };
  auto resolve_name = [&](const std::string& root) {
    std::vector<Frame> frames;
    auto enter = [&](const std::string& name) {
      const Pending& p = pending.at(name);
      if (!p.expr) {  // its syntax error is reported
        table.failed.insert(name);
        return;
      }
      in_progress.insert(name);
      stack.push_back(name);
      frames.push_back({name, {}, 0});
      dim_refs(*p.expr, frames.back().refs);
    };
    if (!table.sizes.count(root) && !table.failed.count(root)) enter(root);
    while (!frames.empty()) {
      Frame& f = frames.back();
      if (f.next < f.refs.size()) {
        const std::string& dep = f.refs[f.next++]->text;
        // Unknown names are reported by eval_dim_expr below, at the use.
        if (table.sizes.count(dep) || table.failed.count(dep) || !pending.count(dep)) continue;
        if (in_progress.count(dep)) {
          std::string cycle;
          for (auto s = std::find(stack.begin(), stack.end(), dep); s != stack.end(); ++s) cycle += *s + " -> ";
          ctx.diag().error(table.locs[dep], fmt::format("dim '{}' depends on itself: {}{}", dep, cycle, dep),
                           "define it from dims that do not refer back to it");
          table.failed.insert(dep);
          continue;
        }
        enter(dep);
        continue;
      }
      // Every dim it refers to is resolved or failed: evaluate it.
      const std::string name = f.name;
      frames.pop_back();
      stack.pop_back();
      in_progress.erase(name);
      const ir::SourceLoc base = pending.at(name).base;
      const Expr& expr = *pending.at(name).expr;
      std::optional<int64_t> v = eval_dim_expr(expr, table, base, ctx.diag());
      if (v && *v <= 0) {
        ctx.diag().error(base,
                         fmt::format("dim '{}' must be positive, got {}{}", name, *v, override_note(expr, table)),
                         "every dim is the size of a tensor axis");
        v.reset();
      }
      if (!v || table.failed.count(name)) {
        table.failed.insert(name);
        continue;
      }
      table.sizes[name] = *v;
      if (!table.overrides.empty()) {
        std::set<std::string> from = overrides_in(expr, table);
        if (!from.empty()) table.from_overrides[name] = std::move(from);
      }
    }
  };
  for (const std::string& name : table.order) resolve_name(name);
  return table;
}

std::optional<std::vector<ir::Dim>> read_shape(const YAML::Node& shape, const DimTable& dims,
                                               YamlContext& ctx, const std::string& what) {
  if (!shape.IsSequence()) {
    ctx.error(shape, fmt::format("the shape of {} must be a list of dims", what),
              "write it in brackets, like shape: [batch, d] (a vector: [d]; a scalar: [])");
    return std::nullopt;
  }
  std::vector<ir::Dim> out;
  bool ok = true;
  for (const YAML::Node& entry : shape) {
    ExprPtr e = ctx.parse_scalar_expr(entry, fmt::format("the shape of {}", what));
    if (!e) {
      ok = false;
      continue;
    }
    std::optional<int64_t> size = eval_dim_expr(*e, dims, ctx.text_loc(entry), ctx.diag());
    if (!size) {
      ok = false;
      continue;
    }
    if (*size <= 0) {
      ctx.error(entry, fmt::format("the shape of {} has a non-positive size {}{}", what, *size, override_note(*e, dims)),
                "every size in a shape must be at least 1");
      ok = false;
      continue;
    }
    std::string name = e->kind == ExprKind::Number ? "" : to_string(*e);
    name.erase(std::remove(name.begin(), name.end(), ' '), name.end());
    out.push_back({*size, name});
  }
  if (!ok) return std::nullopt;
  double elements = ir::element_count(out);
  if (elements > ir::kMaxElements) {
    ctx.error(shape, fmt::format("{} would have {:.3g} elements, more than napkin's limit of 2^50", what, elements),
              "check the dims: this is far beyond any device's memory");
    return std::nullopt;
  }
  return out;
}

namespace {

// A dtype: scalar, as a DType; reported at the node otherwise.
std::optional<ir::DType> read_dtype(const YAML::Node& node, const std::string& what, bool floating_only,
                                    YamlContext& ctx) {
  std::optional<ir::DType> parsed = ir::parse_dtype(node.IsScalar() ? node.Scalar() : "");
  const std::string written = node.IsScalar() ? node.Scalar() : "?";
  if (floating_only && (!parsed || !ir::is_floating(*parsed))) {
    ctx.error(node, fmt::format("{} must have a floating-point dtype, got '{}'", what, written),
              "parameters are trained by gradients: use f32 (the default), bf16 or f16");
    return std::nullopt;
  }
  if (!parsed)
    ctx.error(node, fmt::format("unknown dtype '{}' for {}", written, what),
              fmt::format("known dtypes: {}", ir::dtype_names_list()));
  return parsed;
}

}  // namespace

std::optional<ir::TensorType> read_declaration(const YAML::Node& key, const YAML::Node& spec,
                                               const std::string& what, const DimTable& dims, YamlContext& ctx,
                                               const DeclarationRules& rules) {
  std::vector<std::string> allowed = {"shape"};
  if (!rules.needs.empty()) allowed.push_back(rules.needs);
  allowed.push_back("dtype");
  int errors_before = ctx.diag().error_count();
  if (!ctx.check_keys(spec, allowed, what)) return std::nullopt;
  // A misspelled key ("shpe") is already reported with a suggestion; "has no shape" would repeat it.
  bool misspelled = ctx.diag().error_count() != errors_before;
  if (!spec["shape"]) {
    if (!misspelled) ctx.error(key, fmt::format("{} has no shape", what), "add shape: [dims...]");
    return std::nullopt;
  }
  auto shape = read_shape(spec["shape"], dims, ctx, what);
  ir::DType dtype = ir::DType::F32;
  if (const YAML::Node& d = spec["dtype"]) {
    auto parsed = read_dtype(d, what, rules.floating_only, ctx);
    if (!parsed) return std::nullopt;
    dtype = *parsed;
  }
  if (!rules.needs.empty() && !spec[rules.needs]) {
    if (!misspelled) ctx.error(key, fmt::format("{} has no {}", what, rules.needs), rules.needs_hint);
    return std::nullopt;
  }
  if (!shape) return std::nullopt;
  return ir::TensorType{dtype, *shape};
}

std::optional<std::map<std::string, int64_t>> parse_dim_overrides(std::string_view text, std::string& error) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    return s;
  };
  auto fail = [&](std::string message) -> std::optional<std::map<std::string, int64_t>> {
    error = std::move(message);
    return std::nullopt;
  };
  auto is_name = [](std::string_view s) {
    auto start = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; };
    if (s.empty() || !start(s[0])) return false;
    return std::all_of(s.begin(), s.end(), [&](char c) { return start(c) || std::isdigit(static_cast<unsigned char>(c)) || c == '.'; });
  };
  if (trim(text).empty()) return fail("no dims given: write name=value pairs separated by commas, e.g. d=32,layers=2");
  std::map<std::string, int64_t> out;
  for (size_t pos = 0; pos <= text.size();) {
    size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view entry = trim(text.substr(pos, comma - pos));
    pos = comma + 1;
    if (entry.empty())
      return fail(fmt::format("'{}' has an empty entry (a comma too many): write name=value pairs separated by single "
                              "commas, e.g. d=32,layers=2", trim(text)));
    size_t eq = entry.find('=');
    if (eq == std::string_view::npos)
      return fail(fmt::format("'{}' is not name=value: write e.g. d=32", entry));
    std::string_view name = trim(entry.substr(0, eq));
    std::string_view value = trim(entry.substr(eq + 1));
    if (name.empty()) return fail(fmt::format("'{}' has no dim name before '='", entry));
    if (!is_name(name))
      return fail(fmt::format("'{}' is not a dim name: names are letters, digits and '_', starting with a letter or '_'",
                              name));
    if (value.empty()) return fail(fmt::format("dim '{}' has no value after '='", name));
    if (!std::all_of(value.begin(), value.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      return fail(fmt::format("the value of dim '{}' must be a positive integer, got '{}'", name, value));
    // Digits only: accumulate with a bound so that a long number cannot overflow.
    int64_t v = 0;
    for (char c : value) {
      v = v * 10 + (c - '0');
      if (v > kMaxDimValue)
        return fail(fmt::format("the value of dim '{}' is out of range: dims must stay below 2^48, got {}", name, value));
    }
    if (v < 1) return fail(fmt::format("the value of dim '{}' must be positive, got {}", name, value));
    if (!out.emplace(std::string(name), v).second) return fail(fmt::format("dim '{}' is given twice", name));
  }
  return out;
}

}  // namespace napkin::frontend
