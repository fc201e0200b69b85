#include "support/routing_graph.h"

#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "ir/builder.h"
#include "passes/pipeline.h"

namespace napkin::testing {

namespace {

ir::TensorType type(std::vector<int64_t> sizes, ir::DType dtype) {
  ir::TensorType t;
  t.dtype = dtype;
  for (int64_t s : sizes) t.dims.push_back({s, ""});
  return t;
}

}  // namespace

ir::Graph routing_training_graph(ir::DType dtype, ir::PrecisionPolicy policy, const RoutingDims& n) {
  ir::Graph g;
  ir::Builder b(g);
  const ir::SourceLoc loc{std::make_shared<const std::string>("routing.yaml"), 1, 1};
  b.set_loc(loc);
  auto op = [&](ir::Op o, std::vector<ir::ValueId> in, ir::Attrs attrs = {}) {
    ir::Built built = b.add(o, std::move(in), std::move(attrs));
    INFO(built.error);
    REQUIRE(built.ok());
    return built.value;
  };
  auto out = [&](ir::ValueId v, int i) { return g.node(g.value(v).producer).out(i); };
  auto constant = [&](double v, ir::DType t) { return b.must(b.constant(v, t)); };
  auto reshape = [&](ir::ValueId v, std::vector<int64_t> sizes) { return b.must(b.reshape(v, type(sizes, dtype).dims)); };
  auto sum = [&](ir::ValueId v, std::vector<int64_t> axes) {
    return op(ir::Op::ReduceSum, {v}, {{"axes", axes}, {"keepdims", int64_t{0}}});
  };
  ir::InitSpec init;
  init.kind = ir::InitSpec::Kind::Normal, init.std = 1;

  const ir::ValueId x = g.add_input("x", type({n.tokens, n.d}, dtype), loc);
  const ir::ValueId router = g.add_param("router", type({n.experts, n.d}, dtype), init, loc);
  const ir::ValueId w = g.add_param("w", type({n.experts, n.f, n.d}, dtype), init, loc);
  const ir::ValueId logits = op(ir::Op::MatMul, {x, b.must(b.permute(router, {1, 0}))});
  const ir::ValueId values = op(ir::Op::TopK, {logits}, {{"k", n.k}});
  const ir::ValueId pos = op(ir::Op::MoeSlots, {out(values, 1)}, {{"experts", n.experts}, {"capacity", n.capacity}});
  const ir::ValueId src = out(pos, 1), counts = out(pos, 2);
  const ir::ValueId xe = op(ir::Op::Embedding, {x, src});  // [E, C, d]
  const ir::ValueId ye = op(ir::Op::Einsum, {xe, w},
                            {{"lhs", std::vector<int64_t>{0, 1, 2}}, {"rhs", std::vector<int64_t>{0, 3, 2}},
                             {"out", std::vector<int64_t>{0, 1, 3}}, {"axis_names", std::string("e c d f")},
                             {"spec", std::string("e c d, e f d -> e c f")}});
  const ir::ValueId slot = op(ir::Op::Maximum, {pos, constant(0, ir::DType::I32)});
  const ir::ValueId picked = op(ir::Op::Embedding, {reshape(ye, {n.experts * n.capacity, n.f}), slot});  // [T, k, f]
  const ir::ValueId kept = op(ir::Op::GreaterEqual, {pos, constant(0, ir::DType::I32)});
  const ir::ValueId gate = op(ir::Op::Where, {kept, values, constant(0, dtype)});
  const ir::ValueId y = sum(op(ir::Op::Mul, {picked, reshape(gate, {n.tokens, n.k, 1})}), {1});
  const ir::ValueId balance =
      sum(op(ir::Op::Mul, {op(ir::Op::Cast, {counts}, {{"dtype", dtype}}), sum(logits, {0})}), {0});
  const ir::ValueId loss = op(ir::Op::Add, {sum(op(ir::Op::Mul, {y, y}), {0, 1}), balance});
  g.outputs = {{"loss", loss}};
  g.config.optimizer.kind = ir::OptimizerKind::SGD;
  g.config.optimizer.lr = 0.01;
  g.config.precision.policy = policy;
  ir::Diagnostics diag;
  passes::run_training_pipeline(g, diag);
  INFO(diag.render());
  REQUIRE_FALSE(diag.has_errors());
  return g;
}

}  // namespace napkin::testing
