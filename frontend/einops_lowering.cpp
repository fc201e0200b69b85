// einsum, rearrange and reduce: einops patterns lowered to IR.
//
// einsum of two operands becomes one Einsum node (axis ids in attributes, so
// ir/ never parses strings); of more, a chain of them; of one, a sum and a
// permute. rearrange and reduce become: reshape to elementary axes (splitting
// groups), optionally a reduction, a permute, and a reshape that merges the
// output groups. Reshapes are free views when the strides allow; the Builder
// inserts a Copy when they do not, and the report shows which rearranges copy.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "frontend/einops_pattern.h"
#include "frontend/lowering.h"

namespace napkin::frontend {

using ir::Op;
using ir::ValueId;

namespace {

// The source offset of byte `offset` of the pattern string (past its quote).
int at(const Operand& pattern, int offset) { return pattern.offset + 1 + offset; }

// Parses the pattern operand; errors point inside the string.
std::optional<Pattern> parse(Lowerer& L, const Operand& pattern, const std::string& fn) {
  if (pattern.kind != Operand::Kind::String) {
    if (pattern.ok())
      L.error(pattern.offset, fmt::format("{}: the pattern must be a string", fn),
              "quote it, like \"b s d -> b d s\"");
    return std::nullopt;
  }
  PatternResult r = parse_pattern(pattern.text);
  for (const PatternError& e : r.errors)
    L.error(at(pattern, e.offset),
            fmt::format("{}: {}", fn, to_file_columns(e.message, L.column(at(pattern, 0)))),
            "a pattern names each axis, groups merged axes in parentheses: \"b s (h d) -> b h s d\"");
  if (!r.ok()) return std::nullopt;
  return r.pattern;
}

std::string side_text(const PatternSide& side) {
  std::vector<std::string> parts;
  for (const PatternAxis& a : side.axes) {
    if (a.is_group) parts.push_back(fmt::format("({})", fmt::join(a.names, " ")));
    else if (a.names.empty()) parts.push_back("1");
    else parts.push_back(a.names[0]);
  }
  return fmt::format("{}", fmt::join(parts, " "));
}

struct Elementary {
  std::vector<std::string> order;            // elementary axes in input order
  std::map<std::string, ir::Dim> dims;       // their sizes and names
};

// Solves the sizes of the elementary axes of the input side against x's shape.
std::optional<Elementary> solve_input(Lowerer& L, const ir::TensorType& x, const PatternSide& side,
                                      const std::map<std::string, Operand>& sizes, const Operand& pattern,
                                      const std::string& fn) {
  if (static_cast<int>(side.axes.size()) != x.rank()) {
    L.error(at(pattern, side.offset),
            fmt::format("{}: the pattern '{}' has {} axes but the tensor {} has {}", fn, side_text(side),
                        side.axes.size(), ir::to_string(x), x.rank()),
            "write one entry per axis; group axes that are merged, like (h d)");
    return std::nullopt;
  }
  Elementary e;
  auto given = [&](const std::string& name) -> std::optional<ir::Dim> {
    auto it = sizes.find(name);
    if (it == sizes.end()) return std::nullopt;
    auto v = L.need_int(it->second, fmt::format("{}: size of axis '{}'", fn, name));
    if (!v) return ir::Dim{-1, ""};
    // A size below 1 is reported here: the callers read a negative size as
    // "already reported" and fail silently.
    if (*v < 1) {
      L.error(it->second.offset, fmt::format("{}: the size of axis '{}' must be positive, got {}", fn, name, *v),
              "an axis size is a whole number >= 1, such as h=4 or h=heads");
      return ir::Dim{-1, ""};
    }
    return ir::Dim{*v, it->second.text.empty() ? name : it->second.text};
  };
  for (int i = 0; i < x.rank(); ++i) {
    const PatternAxis& axis = side.axes[i];
    const ir::Dim& dim = x.dims[i];
    if (axis.names.empty()) {
      if (dim.size != 1) {
        L.error(at(pattern, axis.offset),
                fmt::format("{}: '1' needs an axis of size 1, but axis {} is {}", fn, i, ir::describe_dim(dim)),
                "name the axis instead of writing 1");
        return std::nullopt;
      }
      continue;
    }
    if (!axis.is_group) {
      const std::string& name = axis.names[0];
      if (auto g = given(name); g && g->size != dim.size) {
        if (g->size >= 0)
          L.error(at(pattern, axis.offset),
                  fmt::format("{}: axis '{}' is {} in the tensor but {}={} was given", fn, name,
                              ir::describe_dim(dim), name, g->size),
                  fmt::format("drop {}= or give the tensor's size", name));
        return std::nullopt;
      }
      e.order.push_back(name);
      e.dims[name] = dim.name.empty() ? ir::Dim{dim.size, name} : dim;
      continue;
    }
    int64_t known = 1;
    std::string unknown;
    for (const std::string& name : axis.names) {
      auto g = given(name);
      if (g && g->size < 0) return std::nullopt;
      // Sizes may be up to 2^53 each: a product past the axis is a mismatch, and
      // computing it could overflow int64.
      if (g && g->size > dim.size / known) {
        L.error(at(pattern, axis.offset),
                fmt::format("{}: the sizes given for the group ({}) multiply to more than the tensor's axis {}, "
                            "which is {}", fn, fmt::join(axis.names, " "), i, ir::describe_dim(dim)),
                "the product of the group's sizes must equal the axis");
        return std::nullopt;
      }
      if (g) {
        known *= g->size;
        e.dims[name] = *g;
      } else if (unknown.empty()) {
        unknown = name;
      } else {
        L.error(at(pattern, axis.offset),
                fmt::format("{}: the group ({}) has two axes of unknown size, '{}' and '{}'", fn,
                            fmt::join(axis.names, " "), unknown, name),
                fmt::format("give one of them as a keyword, e.g. {}={}", unknown, "n"));
        return std::nullopt;
      }
      e.order.push_back(name);
    }
    if (unknown.empty() ? known != dim.size : (known <= 0 || dim.size % known != 0)) {
      L.error(at(pattern, axis.offset),
              fmt::format("{}: the group ({}) has size {} but the tensor's axis {} is {}", fn,
                          fmt::join(axis.names, " "), unknown.empty() ? fmt::format("{}", known)
                                                                       : fmt::format("{}*{}", known, unknown),
                          i, ir::describe_dim(dim)),
              unknown.empty() ? "the product of the group's sizes must equal the axis"
                              : "the axis must divide exactly by the sizes given");
      return std::nullopt;
    }
    if (!unknown.empty()) e.dims[unknown] = {dim.size / known, unknown};
  }
  for (const auto& [name, value] : sizes)
    if (!e.dims.count(name)) {
      L.error(value.offset, fmt::format("{}: '{}' is not an axis of the pattern's left side", fn, name),
              "axis sizes can be given only for axes named on the left of '->'");
      return std::nullopt;
    }
  return e;
}

// The output shape of a side: groups multiply, "1" is a new axis of size 1.
std::vector<ir::Dim> output_dims(const PatternSide& side, const Elementary& e) {
  std::vector<ir::Dim> dims;
  for (const PatternAxis& axis : side.axes) {
    if (axis.names.empty()) {
      dims.push_back({1, ""});
      continue;
    }
    if (axis.names.size() == 1) {
      dims.push_back(e.dims.at(axis.names[0]));
      continue;
    }
    ir::Dim d{1, ""};
    std::vector<std::string> names;
    for (const std::string& n : axis.names) {
      d.size *= e.dims.at(n).size;
      names.push_back(e.dims.at(n).name);
    }
    d.name = fmt::format("{}", fmt::join(names, "*"));
    dims.push_back(d);
  }
  return dims;
}

std::set<std::string> names_of(const PatternSide& side) {
  std::set<std::string> names;
  for (const PatternAxis& a : side.axes)
    for (const std::string& n : a.names) names.insert(n);
  return names;
}

// Reshape to elementary axes, optionally reduce some, permute to the output
// order, reshape to the output groups.
Operand lower_einops(Lowerer& L, ValueId x, const Pattern& p, const Elementary& e, std::optional<Op> reduction,
                     int offset) {
  ir::Builder& b = L.builder_at(offset);
  std::vector<ir::Dim> elementary;
  for (const std::string& n : e.order) elementary.push_back(e.dims.at(n));
  Operand cur = L.wrap(b.reshape(x, elementary), offset);
  if (!cur.ok()) return cur;
  std::vector<std::string> order = e.order;
  if (reduction) {
    std::set<std::string> kept = names_of(p.output);
    std::vector<int64_t> axes;
    std::vector<std::string> remaining;
    for (size_t i = 0; i < order.size(); ++i) {
      if (kept.count(order[i])) remaining.push_back(order[i]);
      else axes.push_back(static_cast<int64_t>(i));
    }
    if (!axes.empty()) {
      cur = L.build(*reduction, {cur.value}, {{"axes", axes}, {"keepdims", int64_t{0}}}, offset);
      if (!cur.ok()) return cur;
    }
    order = remaining;
  }
  std::vector<int64_t> perm;
  for (const PatternAxis& a : p.output.axes)
    for (const std::string& n : a.names)
      perm.push_back(std::find(order.begin(), order.end(), n) - order.begin());
  cur = L.wrap(b.permute(cur.value, perm), offset);
  if (!cur.ok()) return cur;
  return L.wrap(b.reshape(cur.value, output_dims(p.output, e)), offset);
}

struct Prepared {
  Pattern pattern;
  Elementary elementary;
};

// The checks rearrange and reduce share: parse the pattern, require one
// operand, solve its axes against x, and require every output axis to be an
// input axis (`right_hint` says what the op can do instead).
std::optional<Prepared> prepare(Lowerer& L, ValueId x, const Operand& pattern,
                                const std::map<std::string, Operand>& sizes, const std::string& fn,
                                const char* right_hint) {
  auto p = parse(L, pattern, fn);
  if (!p) return std::nullopt;
  if (p->inputs.size() != 1) {
    L.error(at(pattern, 0), fmt::format("{}: the pattern must have exactly one operand left of '->'", fn),
            fmt::format("{} takes one tensor; use einsum to combine two", fn));
    return std::nullopt;
  }
  auto e = solve_input(L, L.type(x), p->inputs[0], sizes, pattern, fn);
  if (!e) return std::nullopt;
  std::set<std::string> in = names_of(p->inputs[0]);
  for (const PatternAxis& axis : p->output.axes)
    for (const std::string& n : axis.names)
      if (!in.count(n)) {
        L.error(at(pattern, axis.offset), fmt::format("{}: axis '{}' on the right is not on the left", fn, n),
                right_hint);
        return std::nullopt;
      }
  return Prepared{std::move(*p), std::move(*e)};
}

}  // namespace

namespace {

// An operand of an einsum while it is contracted: a tensor and the axis id of
// each of its axes.
struct EinsumTerm {
  ValueId value;
  std::vector<int64_t> ids;
};

std::string einsum_side(const std::vector<int64_t>& ids, const std::vector<std::string>& names) {
  std::vector<std::string> parts;
  for (int64_t id : ids) parts.push_back(names[id]);
  return fmt::format("{}", fmt::join(parts, " "));
}

// einsum(x, "i j -> j"): the axes missing from the output are summed, the rest
// permuted to the output's order. No contraction, so no Einsum node.
Operand lower_unary_einsum(Lowerer& L, const EinsumTerm& x, const std::vector<int64_t>& out, int offset) {
  std::vector<int64_t> summed, kept;
  for (size_t i = 0; i < x.ids.size(); ++i) {
    if (std::find(out.begin(), out.end(), x.ids[i]) == out.end()) summed.push_back(static_cast<int64_t>(i));
    else kept.push_back(x.ids[i]);
  }
  Operand cur = Operand::tensor(x.value, offset);
  if (!summed.empty()) {
    cur = L.build(Op::ReduceSum, {cur.value}, {{"axes", summed}, {"keepdims", int64_t{0}}}, offset);
    if (!cur.ok()) return cur;
  }
  std::vector<int64_t> perm;
  for (int64_t id : out) perm.push_back(std::find(kept.begin(), kept.end(), id) - kept.begin());
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  if (identity) return cur;
  return L.wrap(L.builder_at(offset).permute(cur.value, perm), offset);
}

// Three or more operands: a chain of two-operand Einsum nodes, chosen greedily.
// Each step contracts the pair whose contraction costs the fewest FLOPs (2 x
// the product of the sizes of every axis either has; ties: the smaller result,
// then the leftmost pair). The result keeps the axes that a remaining operand
// or the output still needs, in order of appearance; the last step produces
// the output's order. An axis no other operand has is summed in the first
// contraction of its operand.
Operand lower_einsum_chain(Lowerer& L, std::vector<EinsumTerm> terms, const std::vector<int64_t>& out,
                           const std::map<int64_t, int64_t>& size_of, const std::vector<std::string>& names,
                           int offset) {
  auto product = [&](const std::vector<int64_t>& ids) {
    double p = 1;  // a double: sizes up to 2^50 each would overflow int64
    for (int64_t id : ids) p *= static_cast<double>(size_of.at(id));
    return p;
  };
  auto has = [](const std::vector<int64_t>& ids, int64_t id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); };
  const std::string axis_names = fmt::format("{}", fmt::join(names, " "));
  while (terms.size() > 1) {
    struct Step {
      size_t i = 0, j = 0;
      std::vector<int64_t> result;
      double flops = 0, size = 0;
    };
    std::optional<Step> best;
    for (size_t i = 0; i < terms.size(); ++i)
      for (size_t j = i + 1; j < terms.size(); ++j) {
        Step step{i, j, {}, 0, 0};
        std::vector<int64_t> both = terms[i].ids;
        for (int64_t id : terms[j].ids)
          if (!has(both, id)) both.push_back(id);
        if (terms.size() == 2) {
          step.result = out;
        } else {
          for (int64_t id : both) {
            bool needed = has(out, id);
            for (size_t k = 0; k < terms.size() && !needed; ++k) needed = k != i && k != j && has(terms[k].ids, id);
            if (needed) step.result.push_back(id);
          }
        }
        step.flops = 2 * product(both);
        step.size = product(step.result);
        if (!best || step.flops < best->flops || (step.flops == best->flops && step.size < best->size))
          best = std::move(step);
      }
    const EinsumTerm &a = terms[best->i], &b = terms[best->j];
    ir::Attrs attrs{{"lhs", a.ids},
                    {"rhs", b.ids},
                    {"out", best->result},
                    {"axis_names", axis_names},
                    {"spec", fmt::format("{}, {} -> {}", einsum_side(a.ids, names), einsum_side(b.ids, names),
                                         einsum_side(best->result, names))}};
    Operand r = L.build(Op::Einsum, {a.value, b.value}, attrs, offset);
    if (!r.ok()) return r;
    terms[best->i] = {r.value, best->result};
    terms.erase(terms.begin() + static_cast<std::ptrdiff_t>(best->j));
  }
  return Operand::tensor(terms[0].value, offset);
}

}  // namespace

Operand lower_einsum(Lowerer& L, const std::vector<Operand>& operands, const Operand& pattern, int offset) {
  auto p = parse(L, pattern, "einsum");
  if (!p) return Operand::invalid();
  const size_t n = operands.size();
  if (p->inputs.size() != n) {
    L.error(at(pattern, 0),
            fmt::format("einsum: the pattern names {} operand{} but einsum is given {} tensor{}", p->inputs.size(),
                        p->inputs.size() == 1 ? "" : "s", n, n == 1 ? "" : "s"),
            "write one axis list per tensor, separated by commas: \"<axes of a>, <axes of b> -> <axes of the "
            "result>\"");
    return Operand::invalid();
  }
  std::map<std::string, int64_t> ids;
  std::vector<std::string> id_names;
  auto id_of = [&](const std::string& name) {
    auto [it, fresh] = ids.emplace(name, static_cast<int64_t>(ids.size()));
    if (fresh) id_names.push_back(name);
    return it->second;
  };
  std::vector<EinsumTerm> terms;
  for (size_t k = 0; k < n; ++k) {
    const PatternSide& side = p->inputs[k];
    EinsumTerm term{operands[k].value, {}};
    for (const PatternAxis& axis : side.axes) {
      if (axis.is_group || axis.names.size() != 1) {
        L.error(at(pattern, axis.offset), "einsum: axes cannot be grouped or be '1' in an einsum pattern",
                "rearrange the operand first, then contract");
        return Operand::invalid();
      }
      term.ids.push_back(id_of(axis.names[0]));
    }
    const ir::TensorType& t = L.type(term.value);
    if (static_cast<int>(term.ids.size()) != t.rank()) {
      L.error(at(pattern, side.offset),
              fmt::format("einsum: operand {} is {} with {} axes but the pattern '{}' names {}", k + 1,
                          ir::to_string(t), t.rank(), side_text(side), term.ids.size()),
              "write one axis name per dimension of the operand");
      return Operand::invalid();
    }
    terms.push_back(std::move(term));
  }
  std::vector<int64_t> out;
  for (const PatternAxis& axis : p->output.axes) {
    if (axis.is_group || axis.names.size() != 1) {
      L.error(at(pattern, axis.offset), "einsum: output axes cannot be grouped or be '1'",
              "rearrange the result afterwards");
      return Operand::invalid();
    }
    if (!ids.count(axis.names[0])) {
      L.error(at(pattern, axis.offset),
              fmt::format("einsum: output axis '{}' does not appear in {}", axis.names[0],
                          n == 1 ? "the operand" : n == 2 ? "either operand" : "any operand"),
              "every output axis must come from an operand");
      return Operand::invalid();
    }
    out.push_back(ids[axis.names[0]]);
  }
  if (n == 2) {  // one Einsum node, which checks dtypes and sizes itself
    ir::Attrs attrs{{"lhs", terms[0].ids},
                    {"rhs", terms[1].ids},
                    {"out", out},
                    {"axis_names", fmt::format("{}", fmt::join(id_names, " "))},
                    {"spec", pattern.text}};
    return L.build(Op::Einsum, {terms[0].value, terms[1].value}, attrs, offset);
  }
  // One operand or a chain: the checks a single Einsum node would make, made
  // here so that each error names the operand as written, not an intermediate.
  const ir::TensorType& first = L.type(terms[0].value);
  if (!ir::is_floating(first.dtype)) {
    L.error(operands[0].offset, fmt::format("einsum needs floating-point operands, got {}", ir::to_string(first)),
            "convert it with cast(x, f32)");
    return Operand::invalid();
  }
  std::map<int64_t, int64_t> size_of;
  std::map<int64_t, std::pair<ir::Dim, size_t>> seen;  // id -> its dim and the first operand that has it
  for (size_t k = 0; k < n; ++k) {
    const ir::TensorType& t = L.type(terms[k].value);
    if (t.dtype != first.dtype) {
      L.error(operands[k].offset,
              fmt::format("einsum: dtype mismatch: operand 1 is {} but operand {} is {}", ir::dtype_name(first.dtype),
                          k + 1, ir::dtype_name(t.dtype)),
              fmt::format("convert it with cast(x, {})", ir::dtype_name(first.dtype)));
      return Operand::invalid();
    }
    for (size_t i = 0; i < terms[k].ids.size(); ++i) {
      int64_t id = terms[k].ids[i];
      const ir::Dim& d = t.dims[i];
      auto [it, fresh] = seen.emplace(id, std::make_pair(d, k));
      if (!fresh && it->second.first.size != d.size) {
        L.error(operands[k].offset,
                fmt::format("einsum: axis '{}' is {} in operand {} but {} in operand {}", id_names[id],
                            ir::describe_dim(it->second.first), it->second.second + 1, ir::describe_dim(d), k + 1),
                "the same axis name must have the same size everywhere in the pattern");
        return Operand::invalid();
      }
      size_of[id] = d.size;
    }
  }
  if (n == 1) return lower_unary_einsum(L, terms[0], out, offset);
  return lower_einsum_chain(L, std::move(terms), out, size_of, id_names, offset);
}

Operand lower_rearrange(Lowerer& L, ValueId x, const Operand& pattern, const std::map<std::string, Operand>& sizes,
                        int offset) {
  auto p = prepare(L, x, pattern, sizes, "rearrange", "rearrange only reorders, splits and merges axes");
  if (!p) return Operand::invalid();
  std::set<std::string> out = names_of(p->pattern.output);
  for (const std::string& n : names_of(p->pattern.inputs[0]))
    if (!out.count(n)) {
      L.error(at(pattern, p->pattern.output.offset),
              fmt::format("rearrange: axis '{}' on the left is missing on the right", n),
              "to remove an axis, use reduce(x, pattern, \"sum\") or index it");
      return Operand::invalid();
    }
  return lower_einops(L, x, p->pattern, p->elementary, std::nullopt, offset);
}

Operand lower_reduce(Lowerer& L, ValueId x, const Operand& pattern, const Operand& reduction,
                     const std::map<std::string, Operand>& sizes, int offset) {
  static const std::map<std::string, Op> kinds = {
      {"sum", Op::ReduceSum}, {"mean", Op::ReduceMean}, {"max", Op::ReduceMax}, {"min", Op::ReduceMin}};
  auto kind = kinds.find(reduction.text);
  if (kind == kinds.end()) {
    L.error(reduction.offset, fmt::format("reduce: unknown reduction \"{}\"", reduction.text),
            "use \"sum\", \"mean\", \"max\" or \"min\"");
    return Operand::invalid();
  }
  auto p = prepare(L, x, pattern, sizes, "reduce",
                   "reduce only removes axes; the right side keeps some of the left's axes");
  if (!p) return Operand::invalid();
  return lower_einops(L, x, p->pattern, p->elementary, kind->second, offset);
}

}  // namespace napkin::frontend
