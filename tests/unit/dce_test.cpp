// Dead code elimination: values the loss does not need are erased.
#include <doctest/doctest.h>

#include "passes/dce.h"
#include "frontend/frontend.h"
#include "passes/pipeline.h"

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

TEST_CASE("a parameter only dead code reads is reported as not affecting the loss") {
  ir::Diagnostics diag;
  auto g = frontend::load_model_text(R"yaml(
model: t
inputs: {x: {shape: [4]}}
params: {u: {shape: [4], init: ones}, w: {shape: [4], init: ones}}
forward:
  - dead: x * u
loss: mean(x * w)
optimizer: sgd(lr=0.1)
)yaml", "t.yaml", diag);
  REQUIRE(g);
  REQUIRE(passes::run_forward_pipeline(*g, diag));
  std::string out = diag.render();
  CHECK(out.find("t.yaml:4:10: warning: parameter 'u' does not affect the loss") != std::string::npos);
  CHECK(out.find("'w'") == std::string::npos);
  CHECK_FALSE(diag.has_errors());
}
