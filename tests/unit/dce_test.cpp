// Dead code elimination: values the loss does not need are erased.
#include <doctest/doctest.h>

#include "passes/dce.h"
#include "frontend/frontend.h"

using namespace napkin;

TEST_CASE("dce removes forward values the loss does not use, and only those") {
  ir::Diagnostics diag;
  auto g = frontend::load_model_text(R"yaml(
model: t
inputs: {x: {shape: [4]}}
forward:
  - unused: exp(x) * 2
  - y: relu(x)
loss: mean(y)
optimizer: sgd(lr=0.1)
)yaml", "t.yaml", diag);
  REQUIRE(g);
  size_t before = g->schedule().size();
  auto dce = passes::make_dce_pass();
  CHECK(dce->run(*g, diag));
  CHECK(g->schedule().size() == before - 3);  // exp, constant 2, mul
  for (ir::NodeId id : g->schedule()) CHECK(g->node(id).op != ir::Op::Exp);
  CHECK_FALSE(dce->run(*g, diag));  // a second run changes nothing
}
