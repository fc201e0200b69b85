// Seeded starting points: parameter init from InitSpecs, random check inputs.
#include <algorithm>
#include <optional>

#include "interp/interpreter.h"
#include "runtime/init.h"
#include "runtime/rng.h"

namespace napkin::interp {

namespace {

// Xavier is a truncated normal whose std and cuts the frontend derived.
runtime::ParamInit runtime_init(const ir::InitSpec& s) {
  switch (s.kind) {
    case ir::InitSpec::Kind::Zeros: return {runtime::InitKind::Zeros};
    case ir::InitSpec::Kind::Ones: return {runtime::InitKind::Ones};
    case ir::InitSpec::Kind::Constant: return {runtime::InitKind::Constant, s.value};
    case ir::InitSpec::Kind::Normal: return {runtime::InitKind::Normal, 0, s.std};
    case ir::InitSpec::Kind::TruncNormal:
    case ir::InitSpec::Kind::Xavier: return {runtime::InitKind::TruncNormal, 0, s.std, s.lo, s.hi};
  }
  return {};
}

}  // namespace

std::map<ir::ValueId, std::vector<double>> initial_values(const ir::Graph& g, uint64_t seed) {
  std::map<ir::ValueId, std::vector<double>> out;
  for (const ir::Param& p : g.params) {
    const ir::Value& v = g.value(p.value);
    out[p.value] = runtime::init_values(runtime_init(p.init), v.name, v.type.numel(), seed);
  }
  for (ir::ValueId v : g.state) out[v] = std::vector<double>(g.value(v).type.numel(), 0.0);
  return out;
}

namespace {

// The tightest exclusive upper bound on the values of v that some use of it
// (or of a view or copy of it) imposes, or nullopt.
std::optional<int64_t> id_bound(const ir::Graph& g, const std::multimap<ir::ValueId, std::pair<ir::NodeId, int>>& uses,
                                ir::ValueId v) {
  std::optional<int64_t> bound;
  auto tighten = [&](std::optional<int64_t> b) {
    if (b && (!bound || *b < *bound)) bound = b;
  };
  auto [first, last] = uses.equal_range(v);
  for (auto it = first; it != last; ++it) {
    const ir::Node& n = g.node(it->second.first);
    int input = it->second.second;
    switch (n.op) {
      case ir::Op::Reshape:
      case ir::Op::Permute:
      case ir::Op::Slice:
      case ir::Op::Select:
      case ir::Op::Broadcast:
      case ir::Op::Copy:
      case ir::Op::Concat:
      case ir::Op::Pad: tighten(id_bound(g, uses, n.out())); break;
      case ir::Op::Cast:
        if (ir::is_integer(g.value(n.out()).type.dtype)) tighten(id_bound(g, uses, n.out()));
        break;
      case ir::Op::Embedding:
        if (input == 1) tighten(g.value(n.in(0)).type.dims.at(0).size);
        break;
      case ir::Op::CrossEntropy:
      case ir::Op::CrossEntropyGrad:
        if (input == 1) tighten(g.value(n.in(0)).type.dims.back().size);
        break;
      case ir::Op::EmbeddingGrad:
        if (input == 1) tighten(n.attrs.get_int("vocab"));
        break;
      default: break;
    }
  }
  return bound;
}

}  // namespace

std::map<ir::ValueId, std::vector<double>> random_inputs(const ir::Graph& g, uint64_t seed) {
  std::multimap<ir::ValueId, std::pair<ir::NodeId, int>> uses;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    for (int i = 0; i < static_cast<int>(n.inputs.size()); ++i) uses.insert({n.inputs[i], {id, i}});
  }
  std::map<ir::ValueId, std::vector<double>> out;
  for (ir::ValueId v : g.inputs) {
    const ir::Value& val = g.value(v);
    runtime::Rng rng(seed, runtime::stream_for_name(val.name));
    std::vector<double> data(val.type.numel());
    if (ir::is_floating(val.type.dtype)) {
      for (double& x : data) x = rng.normal();
    } else {
      int64_t n = 2;
      if (ir::is_integer(val.type.dtype)) n = id_bound(g, uses, v).value_or(2);
      for (double& x : data)
        x = static_cast<double>(std::min<int64_t>(static_cast<int64_t>(rng.uniform01() * static_cast<double>(n)), n - 1));
    }
    out[v] = std::move(data);
  }
  if (g.rng != ir::kNoValue) {
    std::vector<double> words;
    for (int64_t w : runtime::rng_tensor_words(seed, 0, true)) words.push_back(static_cast<double>(w));
    out[g.rng] = std::move(words);
  }
  return out;
}

}  // namespace napkin::interp
