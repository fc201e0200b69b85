// passes/fold_concat_copy: the gradient of a fused qkv split (autodiff's
// concat of dq, dk, dv, copied back to the qkv layout) is one concat written
// in the final layout, with the same values (the interpreter runs both forms).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "interp/interpreter.h"
#include "ir/builder.h"
#include "passes/dce.h"
#include "passes/fold_concat_copy.h"
#include "support/test_models.h"

namespace napkin {
namespace {

// Copies whose input is a permuted view of a concat's result.
int copies_of_permuted_concats(const ir::Graph& g) {
  int n = 0;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& copy = g.node(id);
    if (copy.op != ir::Op::Copy) continue;
    ir::NodeId p = g.value(copy.in(0)).producer;
    if (p == ir::kNoNode || g.node(p).op != ir::Op::Permute) continue;
    ir::NodeId c = g.value(g.node(p).in(0)).producer;
    n += c != ir::kNoNode && g.node(c).op == ir::Op::Concat;
  }
  return n;
}

TEST_CASE("fold_concat_copy: a GPT's qkv gradient is one concat in the qkv layout") {
  // attention_layout off: it then has the attention gradient write that layout itself (no concat).
  passes::PipelineOptions options;
  options.attention_layout = false;
  ir::Graph g = testing::compile_small_model(testing::source_path("models/gpt.yaml"), std::nullopt, options);
  CHECK(copies_of_permuted_concats(g) == 0);
  int concats = 0;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    if (n.op != ir::Op::Concat || n.phase != ir::Phase::Backward) continue;
    ++concats;
    CHECK(n.attrs.get_int("axis") == 2);  // [b, s, 3, h, hd]
    CHECK(g.value(n.out()).type.rank() == 5);
    CHECK(g.value(n.out()).type.dims[2].size == 3);
  }
  CHECK(concats > 0);
}

TEST_CASE("fold_concat_copy: the folded concat has the copy's values") {
  // y = copy(permute(concat(a, b))): the pass rewrites it; the interpreter
  // evaluates both graphs on the same inputs.
  ir::Graph g;
  ir::Builder b(g);
  auto input = [&](const char* name, std::vector<int64_t> sizes) {
    ir::TensorType t;
    for (int64_t s : sizes) t.dims.push_back({s, ""});
    t.dtype = ir::DType::F32;
    return g.add_input(name, t, {});
  };
  ir::ValueId x = input("x", {1, 2, 3}), y = input("y", {1, 2, 3});
  ir::ValueId c = b.must(b.add(ir::Op::Concat, {x, y}, {{"axis", int64_t{0}}}));
  ir::ValueId p = b.must(b.permute(c, {1, 0, 2}));
  ir::ValueId out = b.must(b.add(ir::Op::Copy, {p}));
  g.outputs.push_back({"loss", out});
  ir::Graph folded = g;
  ir::Diagnostics diag;
  REQUIRE(passes::make_fold_concat_copy_pass()->run(folded, diag));
  passes::make_dce_pass()->run(folded, diag);  // the old concat and copy
  CHECK(copies_of_permuted_concats(folded) == 0);
  std::vector<double> xs{1, 2, 3, 4, 5, 6}, ys{-1, -2, -3, -4, -5, -6};
  std::vector<std::vector<double>> results;
  for (const ir::Graph* graph : {&g, &folded}) {
    interp::Interpreter in(*graph, interp::Numerics::Float64);
    in.set(graph->inputs[0], xs);
    in.set(graph->inputs[1], ys);
    in.run();
    results.push_back(in.get(graph->outputs[0].second));
  }
  CHECK(results[0] == results[1]);
  CHECK(results[1] == std::vector<double>{1, 2, 3, -1, -2, -3, 4, 5, 6, -4, -5, -6});
}

}  // namespace
}  // namespace napkin
