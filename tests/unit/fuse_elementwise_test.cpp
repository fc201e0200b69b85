// Elementwise fusion (passes/fuse_elementwise.h) on small inline models:
// which groups form and which do not (other shapes, a dependency through a
// node outside the group, another phase), what is internal, that the schedule
// stays valid and the "changed" flag, and the optimizer update as one kernel
// per parameter with its outputs still written in place.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "analysis/memory.h"
#include "ir/fusion_group.h"
#include "ir/verifier.h"
#include "passes/fuse_elementwise.h"
#include "support/fuse_work.h"
#include "support/test_models.h"

using namespace napkin;

namespace {

// Runs the pass on g; REQUIREs a valid graph afterwards.
bool fuse(ir::Graph& g) {
  ir::Diagnostics diag;
  bool changed = passes::make_fuse_elementwise_pass()->run(g, diag);
  std::vector<std::string> problems = ir::verify(g);
  INFO((problems.empty() ? std::string() : problems[0]));
  REQUIRE(problems.empty());
  return changed;
}

// The scheduled nodes of op `op`, in schedule order.
std::vector<ir::NodeId> nodes_of(const ir::Graph& g, ir::Op op, ir::Phase phase = ir::Phase::Forward) {
  std::vector<ir::NodeId> out;
  for (ir::NodeId id : g.schedule())
    if (g.node(id).op == op && g.node(id).phase == phase) out.push_back(id);
  return out;
}

ir::NodeId one_node(const ir::Graph& g, ir::Op op, ir::Phase phase = ir::Phase::Forward) {
  std::vector<ir::NodeId> found = nodes_of(g, op, phase);
  REQUIRE(found.size() == 1);
  return found[0];
}

int position(const ir::Graph& g, ir::NodeId id) {
  const auto& s = g.schedule();
  return static_cast<int>(std::find(s.begin(), s.end(), id) - s.begin());
}

}  // namespace

TEST_CASE("fuse: an elementwise chain with its constants becomes one group - the reduction of it ends the group") {
  ir::Graph g = testing::compile(R"yaml(
model: t
inputs: {x: {shape: [4, 8]}, b: {shape: [8]}}
forward:
  - h: exp(x) * 2 + b
loss: mean(h)
optimizer: sgd(lr=0.1)
)yaml");
  CHECK(fuse(g));
  ir::NodeId e = one_node(g, ir::Op::Exp), m = one_node(g, ir::Op::Mul), a = one_node(g, ir::Op::Add);
  int gid = g.node(e).group;
  CHECK(gid == 0);
  CHECK(g.node(m).group == gid);
  CHECK(g.node(a).group == gid);
  CHECK(g.node(one_node(g, ir::Op::Constant)).group == gid);  // the 2, as an immediate
  const ir::NodeId mean = one_node(g, ir::Op::ReduceMean);
  CHECK(g.node(mean).group == gid);  // h's only reader: the chain is its prologue
  ir::FusionGroups groups = ir::fusion_groups(g);
  REQUIRE(groups.groups.size() == 1);
  const ir::FusionGroup& fg = groups.groups[0];
  CHECK(fg.nodes.size() == 5);
  CHECK(fg.nodes.back() == mean);
  CHECK(fg.reduction == mean);
  CHECK(fg.shape == std::vector<int64_t>{4, 8});  // the reduction's input shape
  CHECK(fg.inputs.size() == 2);  // x, and b read broadcast
  REQUIRE(fg.outputs.size() == 1);
  CHECK(fg.outputs[0] == g.node(mean).out());  // the loss
  CHECK(groups.internal[g.node(e).out()]);
  CHECK(groups.internal[g.node(m).out()]);
  CHECK(groups.internal[g.node(a).out()]);  // h never reaches memory
  // Internal values own no buffer.
  analysis::MemoryReport memory = analysis::analyze_memory(g);
  for (const analysis::MemoryBuffer& buf : memory.buffers) {
    CHECK(buf.value != g.node(e).out());
    CHECK(buf.value != g.node(m).out());
    CHECK(buf.value != g.node(a).out());
  }
  CHECK_FALSE(fuse(g));  // a second run changes nothing
}

TEST_CASE("fuse: one reduction per group joins it as its last member - the group still stores what other kernels read") {
  ir::Graph g = testing::compile(R"yaml(
model: t
inputs: {x: {shape: [4, 8]}}
forward:
  - a: exp(x)
  - b: a * 2
  - s: sum(b)
  - m: mean(a, axis=0)
  - y: tanh(x)
loss: s + sum(m) + sum(y) + max(y)
optimizer: sgd(lr=0.1)
)yaml");
  fuse(g);
  // {exp, mul} takes sum(b), the first reduction of a member's result; mean(a)
  // reads a from memory: the group stores a, and b never leaves it.
  const ir::NodeId e = one_node(g, ir::Op::Exp), mul = one_node(g, ir::Op::Mul);
  const ir::NodeId mean = one_node(g, ir::Op::ReduceMean);
  ir::NodeId sum_b = ir::kNoNode, sum_y = ir::kNoNode;
  const ir::NodeId t = one_node(g, ir::Op::Tanh);
  for (ir::NodeId r : nodes_of(g, ir::Op::ReduceSum)) {
    if (g.node(r).in(0) == g.node(mul).out()) sum_b = r;
    if (g.node(r).in(0) == g.node(t).out()) sum_y = r;
  }
  REQUIRE(sum_b != ir::kNoNode);
  REQUIRE(sum_y != ir::kNoNode);
  CHECK(g.node(e).group >= 0);
  CHECK(g.node(mul).group == g.node(e).group);
  CHECK(g.node(sum_b).group == g.node(e).group);
  CHECK(g.node(mean).group == -1);
  ir::FusionGroups groups = ir::fusion_groups(g);
  const ir::FusionGroup& ab = groups.groups[g.node(e).group];
  CHECK(ab.reduction == sum_b);
  CHECK(ab.nodes.back() == sum_b);
  CHECK_FALSE(groups.internal[g.node(e).out()]);
  CHECK(groups.internal[g.node(mul).out()]);
  CHECK(ab.outputs == std::vector<ir::ValueId>{g.node(e).out(), g.node(sum_b).out()});
  // y is read by two reductions: the first joins tanh's group, which stores y for the other.
  CHECK(g.node(t).group >= 0);
  CHECK(g.node(sum_y).group == g.node(t).group);
  CHECK(g.node(one_node(g, ir::Op::ReduceMax)).group == -1);
  CHECK_FALSE(groups.internal[g.node(t).out()]);
  CHECK(ir::verify(g).empty());
  CHECK_FALSE(fuse(g));
}

TEST_CASE("fuse: a producer of another shape is not fused - a value read outside the group is stored") {
  ir::Graph g = testing::compile(R"yaml(
model: t
inputs: {x: {shape: [4, 8]}, v: {shape: [8]}, w: {shape: [8, 8]}}
forward:
  - u: exp(v)
  - a: tanh(x * u)
  - y: a @ w
loss: mean(y + a)
optimizer: sgd(lr=0.1)
)yaml");
  CHECK(fuse(g));
  ir::NodeId e = one_node(g, ir::Op::Exp), m = one_node(g, ir::Op::Mul), t = one_node(g, ir::Op::Tanh);
  CHECK(g.node(e).group == -1);  // [8] vs [4, 8]: its own kernel
  CHECK(g.node(m).group >= 0);
  CHECK(g.node(t).group == g.node(m).group);
  ir::FusionGroups groups = ir::fusion_groups(g);
  CHECK_FALSE(groups.internal[g.node(t).out()]);  // the matmul and the add read a
  CHECK(groups.internal[g.node(m).out()]);
}

TEST_CASE("fuse: nodes between the members move out of the way, but a dependency through another kernel blocks the merge") {
  ir::Graph g = testing::compile(R"yaml(
model: t
inputs: {x: {shape: [4, 4]}, w: {shape: [4, 4]}}
forward:
  - a: exp(x)
  - m: x @ w
  - b: sqrt(a)
  - c: b + (b @ w)
loss: mean(c * m)
optimizer: sgd(lr=0.1)
)yaml");
  CHECK(fuse(g));
  ir::NodeId e = one_node(g, ir::Op::Exp), s = one_node(g, ir::Op::Sqrt), add = one_node(g, ir::Op::Add);
  ir::NodeId mul = one_node(g, ir::Op::Mul);
  std::vector<ir::NodeId> mm = nodes_of(g, ir::Op::MatMul);
  REQUIRE(mm.size() == 2);
  // exp and sqrt fuse; the independent x @ w moved before them.
  CHECK(g.node(e).group >= 0);
  CHECK(g.node(s).group == g.node(e).group);
  CHECK(position(g, mm[0]) < position(g, e));
  // c = b + (b @ w) cannot join b's group: the matmul would have to run inside it.
  CHECK(g.node(add).group != g.node(s).group);
  CHECK(g.node(mul).group == g.node(add).group);  // but c * m fuses with it
  CHECK(g.node(add).group >= 0);
}

TEST_CASE("fuse: forward and backward nodes are never one group - the SGD update is one kernel per parameter") {
  ir::Graph g = testing::compile_training(R"yaml(
model: t
inputs: {x: {shape: [4, 8]}}
params: {w: {shape: [4, 8], init: ones}, u: {shape: [8], init: ones}}
forward:
  - y: exp(x * w) * u
loss: mean(y)
optimizer: sgd(lr=0.1)
)yaml");
  CHECK_FALSE(fuse(g));  // the pipeline ran it already
  ir::NodeId e = one_node(g, ir::Op::Exp);
  for (ir::NodeId id : g.schedule())
    if (g.node(id).group >= 0 && g.node(id).group == g.node(e).group) CHECK(g.node(id).phase == ir::Phase::Forward);
  ir::FusionGroups groups = ir::fusion_groups(g);
  std::set<ir::Phase> phases;
  for (const ir::FusionGroup& fg : groups.groups) phases.insert(fg.phase);
  CHECK(phases.count(ir::Phase::Backward) == 1);  // the backward chain of mul/exp fuses on its own
  int update_groups = 0;
  for (const ir::FusionGroup& fg : groups.groups) update_groups += fg.phase == ir::Phase::Optimizer && !fg.shape.empty();
  CHECK(update_groups == 2);  // w and u: mul by lr, sub
}

TEST_CASE("fuse: AdamW becomes one kernel per parameter plus one for the scalars, updates still in place") {
  ir::Graph g = testing::compile_training(R"yaml(
model: t
inputs: {x: {shape: [4, 8]}}
params: {w: {shape: [8, 8], init: xavier}, b: {shape: [8], init: zeros}}
forward:
  - y: x @ w + b
loss: mean(y * y)
optimizer: adamw(lr=1e-3, weight_decay=0.01)
)yaml");
  ir::FusionGroups groups = ir::fusion_groups(g);
  std::vector<const ir::FusionGroup*> update;
  for (const ir::FusionGroup& fg : groups.groups)
    if (fg.phase == ir::Phase::Optimizer) update.push_back(&fg);
  REQUIRE(update.size() == 3);
  CHECK(update[0]->shape.empty());  // step, bias corrections, lr·wd: one scalar kernel
  // Every optimizer node but views is in one of these three kernels.
  for (ir::NodeId id : g.schedule())
    if (g.node(id).phase == ir::Phase::Optimizer) CHECK(g.node(id).group >= 0);
  // m, v and the param come out of each per-parameter kernel, written in place.
  for (const ir::FusionGroup* fg : {update[1], update[2]}) CHECK(fg->outputs.size() == 3);
  analysis::MemoryReport memory = analysis::analyze_memory(g);
  for (const analysis::MemoryUpdate& u : memory.updates) CHECK(u.in_place);
}

namespace {

// A model whose forward is h = x then `lines` times `h: <line>`.
std::string chain_model(int lines, const std::string& line) {
  std::string yaml = "model: t\ninputs: {x: {shape: [4, 8]}}\nforward:\n  - h: x * 1\n";
  for (int i = 0; i < lines; ++i) yaml += "  - h: " + line + "\n";
  return yaml + "loss: mean(h)\noptimizer: sgd(lr=0.1)\n";
}

}  // namespace

// The pass once spent time proportional to a group's size on each node that
// joined it (copying and rescanning the members, moving them in the schedule
// array), so a 40k-line chain took minutes. Counted steps instead of a clock:
// a chain 4 times as long must cost about the same per node. The three lines
// join a node to the chain's group, then a new group to it from either side.
TEST_CASE("fuse: the work per node stays flat as an elementwise chain grows - a merge never walks the members") {
  for (const char* line : {"h + 1", "h + exp(x)", "exp(x) + h"}) {
    INFO(line);
    ir::Graph small = testing::compile(chain_model(250, line));
    ir::Graph large = testing::compile(chain_model(1000, line));
    double small_work = testing::fuse_work_per_node(small), large_work = testing::fuse_work_per_node(large);
    INFO(small_work << " vs " << large_work << " steps per node");
    CHECK(large_work < 1.2 * small_work);
    // Still one kernel: the adds (and exps), all in group 0.
    for (ir::NodeId id : large.schedule())
      if (large.node(id).op != ir::Op::ReduceMean) CHECK(large.node(id).group == 0);
  }
}

TEST_CASE("fuse: the optimizer's groups of one signature are scheduled together and run as one batch each") {
  ir::Graph g = testing::compile_small_model(testing::source_path("models/gpt2-124m.yaml"));
  const ir::FusionGroups groups = ir::fusion_groups(g);
  // AdamW with and without weight decay (matrices and embeddings, gains and
  // biases), and gradient clipping's sums of squares of 2-D and 1-D gradients.
  REQUIRE(groups.batches.size() == 4);
  size_t batched = 0;
  for (const ir::FusionBatch& b : groups.batches) {
    REQUIRE(b.groups.size() >= 2);
    batched += b.groups.size();
    const std::string signature = ir::batch_signature(g, groups.groups[b.groups[0]]);
    CHECK_FALSE(signature.empty());
    for (size_t i = 0; i < b.groups.size(); ++i) {
      const ir::FusionGroup& fg = groups.groups[b.groups[i]];
      CHECK(fg.phase == ir::Phase::Optimizer);
      CHECK(ir::batch_signature(g, fg) == signature);
      CHECK(groups.batch_of[fg.id] == static_cast<int>(&b - groups.batches.data()));
      // Adjacent: only views between one group and the next.
      if (i > 0)
        for (int p = groups.groups[b.groups[i - 1]].last + 1; p < fg.first; ++p)
          CHECK(ir::op_info(g.node(g.schedule()[p]).op).op_class == ir::OpClass::View);
    }
    CHECK(groups.kernel_first(b.first) == b.first);
    CHECK(groups.kernel_last(b.first) == b.last);
  }
  CHECK(batched == 2 * g.params.size());  // every parameter's update and its clipping sum
  CHECK(ir::verify(g).empty());
  // A forward or backward group is never batched.
  for (const ir::FusionGroup& fg : groups.groups)
    if (fg.phase != ir::Phase::Optimizer) CHECK(ir::batch_signature(g, fg).empty());
}
