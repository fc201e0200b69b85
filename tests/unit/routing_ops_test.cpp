// top_k and moe_slots in the IR (ir/loop.h TopKParams, MoeSlotsParams): their
// shape and dtype rules (results in the documented order, the user's
// mistakes as messages that say what to do) and their cost rows.
#include <doctest/doctest.h>

#include <string>

#include "ir/builder.h"
#include "ir/graph.h"
#include "ir/op.h"

namespace napkin {
namespace {

using ir::DType;
using ir::Op;

ir::TensorType type(std::vector<ir::Dim> dims, DType dtype) {
  ir::TensorType t;
  t.dtype = dtype;
  t.dims = std::move(dims);
  return t;
}

const ir::Node& producer(const ir::Graph& g, const ir::Built& b) { return g.node(g.value(b.value).producer); }

TEST_CASE("top_k: values in x's dtype and i32 indices, k of the last axis, a k outside [1, n] the user's error") {
  ir::Graph g;
  ir::Builder b(g);
  const ir::ValueId x = g.add_input("x", type({{2, "b"}, {3, "t"}, {8, "experts"}}, DType::BF16), {});
  const ir::Built top = b.add(Op::TopK, {x}, {{"k", int64_t{2}}});
  REQUIRE(top.ok());
  const ir::Node& n = producer(g, top);
  REQUIRE(n.outputs.size() == 2);
  CHECK(ir::to_string(g.value(n.out(0)).type) == "bf16[b=2, t=3, 2]");
  CHECK(ir::to_string(g.value(n.out(1)).type) == "i32[b=2, t=3, 2]");
  CHECK(b.add(Op::TopK, {x}, {{"k", int64_t{8}}}).ok());
  for (int64_t k : {0, 9}) {
    const ir::Built bad = b.add(Op::TopK, {x}, {{"k", k}});
    CHECK(bad.error == "top_k: k = " + std::to_string(k) + " is outside [1, 8], the size of the last axis of "
                                                           "bf16[b=2, t=3, experts=8]");
    CHECK(bad.hint == "k counts the values picked from each row along 'experts' (8): 1 to 8");
  }
  const ir::ValueId ids = g.add_input("ids", type({{4, ""}}, DType::I32), {});
  CHECK(b.add(Op::TopK, {ids}, {{"k", int64_t{1}}}).error == "top_k needs a floating-point input, got i32");
  const ir::ValueId scalar = g.add_input("s", type({}, DType::F32), {});
  CHECK(b.add(Op::TopK, {scalar}, {{"k", int64_t{1}}}).error.find("needs at least one axis") != std::string::npos);
}

TEST_CASE("moe_slots: pos i32 [T, k], src i32 [E, C], counts f32 [E], in that order, from i32 [T, k] indices") {
  ir::Graph g;
  ir::Builder b(g);
  const ir::Attrs attrs{{"experts", int64_t{4}}, {"capacity", int64_t{3}}};
  const ir::ValueId indices = g.add_input("indices", type({{6, "tokens"}, {2, ""}}, DType::I32), {});
  const ir::Built slots = b.add(Op::MoeSlots, {indices}, attrs);
  REQUIRE(slots.ok());
  const ir::Node& n = producer(g, slots);
  REQUIRE(n.outputs.size() == 3);
  CHECK(ir::to_string(g.value(n.out(0)).type) == "i32[tokens=6, 2]");
  CHECK(ir::to_string(g.value(n.out(1)).type) == "i32[4, 3]");
  CHECK(ir::to_string(g.value(n.out(2)).type) == "f32[4]");
  for (const ir::TensorType& bad : {type({{6, ""}, {2, ""}}, DType::I64), type({{12, ""}}, DType::I32),
                                    type({{2, ""}, {3, ""}, {2, ""}}, DType::I32)}) {
    const ir::Built r = b.add(Op::MoeSlots, {g.add_input("bad", bad, {})}, attrs);
    CHECK(r.error.find("moe_slots takes i32 expert indices [tokens, k], got") != std::string::npos);
  }
  CHECK(b.add(Op::MoeSlots, {indices}, {{"experts", int64_t{4}}, {"capacity", int64_t{0}}}).error ==
        "moe_slots needs at least one expert and one slot each, got 4 experts of capacity 0");
  CHECK(b.add(Op::MoeSlots, {indices}, {{"experts", int64_t{1} << 16}, {"capacity", int64_t{1} << 16}})
            .error.find("too many slots for i32 positions") != std::string::npos);
}

TEST_CASE("top_k and moe_slots cost no FLOPs: they read their operand and write their results once") {
  ir::Graph g;
  ir::Builder b(g);
  const ir::ValueId x = g.add_input("x", type({{4, ""}, {8, ""}}, DType::F32), {});
  const ir::Node top = producer(g, b.add(Op::TopK, {x}, {{"k", int64_t{2}}}));
  const ir::OpCost c = ir::op_info(Op::TopK).cost(g, top);
  CHECK(c.flops == 0);
  CHECK(c.bytes_read == 4 * 8 * 4);
  CHECK(c.bytes_written == 4 * 2 * 4 + 4 * 2 * 4);  // values f32, indices i32
  // T = 4, k = 2, E = 3, C = 2: reads T·k·4, writes (T·k + E·C)·4 + E·4.
  const ir::Node slots = producer(g, b.add(Op::MoeSlots, {top.out(1)}, {{"experts", int64_t{3}}, {"capacity", int64_t{2}}}));
  const ir::OpCost s = ir::op_info(Op::MoeSlots).cost(g, slots);
  CHECK(s.flops == 0);
  CHECK(s.bytes_read == 4 * 2 * 4);
  CHECK(s.bytes_written == (4 * 2 + 3 * 2) * 4 + 3 * 4);
}

}  // namespace
}  // namespace napkin
