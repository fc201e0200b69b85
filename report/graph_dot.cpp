#include "report/graph_dot.h"

#include <fmt/format.h>

#include "ir/fusion_group.h"

namespace napkin::report {

namespace {

// A DOT string literal's body: quotes and backslashes escaped.
std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string type_text(const ir::TensorType& t) {
  std::vector<std::string> sizes;
  for (const ir::Dim& d : t.dims) sizes.push_back(std::to_string(d.size));
  return fmt::format("{}[{}]", ir::dtype_name(t.dtype), fmt::join(sizes, ","));
}

std::string node_line(const ir::Graph& g, const ir::Node& n, const std::string& indent) {
  std::string label = std::string(ir::op_name(n.op));
  if (!n.outputs.empty()) label += "\\n" + escaped(type_text(g.value(n.out()).type));
  if (n.loc.known()) label += fmt::format("\\nline {}", n.loc.line);
  std::string style;
  if (ir::op_info(n.op).op_class == ir::OpClass::View) style = ", style=dashed";
  if (n.op == ir::Op::Constant) style = ", fontsize=8";
  return fmt::format("{}n{} [label=\"{}\"{}];\n", indent, n.id, label, style);
}

const char* phase_title(ir::Phase p) {
  switch (p) {
    case ir::Phase::Forward: return "forward";
    case ir::Phase::Backward: return "backward";
    case ir::Phase::Optimizer: return "update";
    case ir::Phase::Decode: return "decode";
    case ir::Phase::Setup: return "setup";
  }
  return "?";
}

}  // namespace

std::string graph_dot(const ir::Graph& g, const DotOptions& options) {
  const ir::FusionGroups groups = ir::fusion_groups(g);
  std::string out = fmt::format("digraph \"{}\" {{\n", escaped(g.name));
  out += "  rankdir=TB;\n  node [shape=box, fontname=\"Helvetica\", fontsize=10];\n";
  auto resident = [&](ir::ValueId v, const char* kind) {
    const ir::Value& value = g.value(v);
    out += fmt::format("  v{} [shape=ellipse, label=\"{} {}\\n{}\"];\n", v, kind, escaped(value.name),
                       escaped(type_text(value.type)));
  };
  for (ir::ValueId v : g.inputs) resident(v, "input");
  for (const ir::Param& p : g.params) resident(p.value, "param");
  for (ir::ValueId v : g.state) resident(v, "state");

  const std::vector<ir::NodeId>& schedule = g.schedule();
  for (ir::Phase phase : {ir::Phase::Forward, ir::Phase::Backward, ir::Phase::Optimizer}) {
    std::string body;
    int open_group = -1;
    for (int p = 0; p < static_cast<int>(schedule.size()); ++p) {
      const ir::Node& n = g.node(schedule[p]);
      if (n.phase != phase) continue;
      int gid = options.fusion_groups ? groups.group_at[p] : -1;
      if (gid != open_group && open_group >= 0) body += "    }\n";
      if (gid != open_group && gid >= 0) {
        int ops = 0;
        for (ir::NodeId m : groups.groups[gid].nodes) ops += g.node(m).op != ir::Op::Constant;
        body += fmt::format("    subgraph cluster_fused_{} {{\n      label=\"fused #{} ({} ops, 1 kernel)\";\n"
                            "      style=filled; fillcolor=\"#dbe9ff\"; color=\"#3070c0\";\n", gid, gid, ops);
      }
      open_group = gid;
      body += node_line(g, n, gid >= 0 ? "      " : "    ");
    }
    if (open_group >= 0) body += "    }\n";
    if (body.empty()) continue;
    out += fmt::format("  subgraph cluster_{} {{\n    label=\"{}\";\n    style=rounded;\n{}  }}\n", phase_title(phase),
                       phase_title(phase), body);
  }

  for (ir::NodeId id : schedule) {
    const ir::Node& n = g.node(id);
    for (ir::ValueId in : n.inputs) {
      ir::NodeId p = g.value(in).producer;
      out += p == ir::kNoNode ? fmt::format("  v{} -> n{};\n", in, id) : fmt::format("  n{} -> n{};\n", p, id);
    }
  }
  return out + "}\n";
}

}  // namespace napkin::report
