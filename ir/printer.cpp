#include "ir/printer.h"

#include <fmt/format.h>

namespace napkin::ir {

ValueNamer::ValueNamer(const Graph& g) : g_(g) {
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (!g.value(v).name.empty()) ++uses_[g.value(v).name];
}

std::string ValueNamer::operator()(ValueId v) const {
  const std::string& name = g_.value(v).name;
  if (name.empty()) return fmt::format("%{}", v);
  if (uses_.at(name) > 1) return fmt::format("%{}.{}", name, v);
  return "%" + name;
}

namespace {

std::string location(const SourceLoc& loc) {
  if (!loc.known()) return "";
  return fmt::format("  # {}:{}:{}", *loc.file, loc.line, loc.col);
}

std::string attrs_text(const Attrs& attrs) {
  if (attrs.all().empty()) return "";
  std::string out = " {";
  bool first = true;
  for (const auto& [k, v] : attrs.all()) {
    out += fmt::format("{}{}={}", first ? "" : ", ", k, to_string(v));
    first = false;
  }
  return out + "}";
}

}  // namespace

std::string print_graph(const Graph& g, const PrintOptions& options) {
  ValueNamer name(g);
  auto loc = [&](const SourceLoc& l) { return options.locations ? location(l) : std::string(); };
  std::string out = fmt::format("graph \"{}\" {{\n", g.name);
  for (ValueId v : g.inputs)
    out += fmt::format("  input {}: {}{}\n", name(v), to_string(g.value(v).type), loc(g.value(v).loc));
  if (g.rng != kNoValue) out += fmt::format("  rng {}: {}\n", name(g.rng), to_string(g.value(g.rng).type));
  for (const Param& p : g.params) {
    const Value& v = g.value(p.value);
    out += fmt::format("  param {}: {} init={}{}\n", name(p.value), to_string(v.type),
                       to_string(p.init), loc(v.loc));
  }
  for (ValueId v : g.state)
    out += fmt::format("  state {}: {}{}\n", name(v), to_string(g.value(v).type), loc(g.value(v).loc));
  Phase phase = Phase::Forward;
  for (NodeId id : g.schedule()) {
    const Node& n = g.node(id);
    if (n.phase != phase) {
      phase = n.phase;
      out += fmt::format("  // {}\n", phase_name(phase));
    }
    std::vector<std::string> outs, ins;
    for (ValueId v : n.outputs) outs.push_back(name(v));
    for (ValueId v : n.inputs) ins.push_back(name(v));
    std::string types;
    for (ValueId v : n.outputs) {
      const Value& value = g.value(v);
      types += (types.empty() ? "" : ", ") + to_string(value.type);
      if (value.is_view())
        types += fmt::format(" view of {} {}", name(value.storage), to_string(value.layout));
    }
    out += fmt::format("  {} = {}({}){} : {}{}{}{}\n", fmt::join(outs, ", "), op_name(n.op),
                       fmt::join(ins, ", "), attrs_text(n.attrs), types,
                       n.group < 0 ? "" : fmt::format("  fused#{}", n.group),
                       n.scope.empty() ? "" : "  @" + n.scope, loc(n.loc));
  }
  for (const auto& [label, v] : g.outputs) out += fmt::format("  output {} = {}\n", label, name(v));
  for (const Graph::Update& u : g.updates) out += fmt::format("  update {} <- {}\n", name(u.target), name(u.value));
  return out + "}\n";
}

}  // namespace napkin::ir
