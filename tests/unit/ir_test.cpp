// The IR core: tensor sizes (the lecture's numbers), layouts and views, the op
// table's shape rules, and the verifier catching broken graphs.
#include <doctest/doctest.h>

#include "ir/builder.h"
#include "ir/graph.h"
#include "ir/op.h"
#include "ir/printer.h"
#include "ir/verifier.h"

using namespace napkin::ir;

namespace {
TensorType f32(std::vector<int64_t> sizes) {
  TensorType t;
  for (int64_t s : sizes) t.dims.push_back({s, ""});
  return t;
}
}  // namespace

TEST_CASE("tensor memory: the lecture's numbers") {
  // CS336 lecture 2: a 4x8 float32 tensor is 128 bytes.
  CHECK(f32({4, 8}).bytes() == 128);
  // One GPT-3 FFN matrix, 12288*4 x 12288 in fp32, is 2304 MiB.
  CHECK(f32({12288 * 4, 12288}).bytes() == int64_t{2304} * 1024 * 1024);
  TensorType bf16 = f32({12288 * 4, 12288});
  bf16.dtype = DType::BF16;
  CHECK(bf16.bytes() == int64_t{1152} * 1024 * 1024);
  CHECK(f32({}).numel() == 1);  // a scalar has one element
}

TEST_CASE("every op in ops.def has a table row with its own name") {
  for (int i = 0; i < kNumOps; ++i) {
    const OpInfo& info = op_info(static_cast<Op>(i));
    CAPTURE(info.name);
    CHECK(static_cast<int>(info.op) == i);
    CHECK(bool(info.infer));
    CHECK(bool(info.cost));
    REQUIRE(find_op(info.name).has_value());
    CHECK(*find_op(info.name) == info.op);
  }
  CHECK_FALSE(find_op("no_such_op").has_value());
}

TEST_CASE("contiguous layouts and reshape views") {
  Layout c = contiguous_layout({2, 3, 4});
  CHECK(c.strides == std::vector<int64_t>{12, 4, 1});
  CHECK(is_contiguous(c, {2, 3, 4}));
  // Splitting and merging contiguous axes is a view.
  auto split = reshape_view_layout({2, 12}, contiguous_layout({2, 12}), {2, 3, 4});
  REQUIRE(split);
  CHECK(split->strides == std::vector<int64_t>{12, 4, 1});
  // A transposed [3,2] (strides 1,3) cannot merge into one axis without a copy...
  Layout transposed{{1, 3}, 0};
  CHECK_FALSE(reshape_view_layout({3, 2}, transposed, {6}));
  // ...but splitting its leading axis still can.
  auto ok = reshape_view_layout({4, 2}, Layout{{1, 4}, 0}, {2, 2, 2});
  REQUIRE(ok);
  CHECK(ok->strides == std::vector<int64_t>{2, 1, 4});
}

TEST_CASE("builder: views alias their input, reshape of a transpose copies") {
  Graph g;
  ValueId x = g.add_input("x", f32({3, 4}), {});
  Builder b(g);
  ValueId t = b.must(b.permute(x, {1, 0}));
  CHECK(g.value(t).is_view());
  CHECK(g.value(t).storage == x);
  CHECK(g.value(t).layout.strides == std::vector<int64_t>{1, 4});
  // Flattening the transpose needs a contiguous copy first.
  ValueId flat = b.must(b.reshape(t, {{12, ""}}));
  const Node& reshape = g.node(g.value(flat).producer);
  CHECK(reshape.op == Op::Reshape);
  CHECK(g.node(g.value(reshape.in(0)).producer).op == Op::Copy);
  // Flattening the original is free.
  ValueId flat2 = b.must(b.reshape(x, {{12, ""}}));
  CHECK(g.node(g.value(flat2).producer).op == Op::Reshape);
  CHECK(g.value(flat2).storage == x);
  // Slices move the offset.
  ValueId row = b.must(b.add(Op::Select, {x}, {{"axis", int64_t{0}}, {"index", int64_t{2}}}));
  CHECK(g.value(row).layout.offset == 8);
  CHECK(verify(g).empty());
}

TEST_CASE("shape rules: broadcasting and matmul name both dims") {
  Graph g;
  TensorType a = f32({16, 784});
  a.dims[1].name = "d";
  TensorType w = f32({512, 10});
  w.dims[0].name = "hidden";
  ValueId x = g.add_input("x", a, {});
  ValueId y = g.add_input("w", w, {});
  Builder b(g);
  Built bad = b.add(Op::MatMul, {x, y});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error == "matmul: inner dims differ: 'd' (784) vs 'hidden' (512)");

  ValueId bias = g.add_input("bias", f32({784}), {});
  Built sum = b.add(Op::Add, {x, bias});
  REQUIRE(sum.ok());
  CHECK(g.value(sum.value).type.sizes() == std::vector<int64_t>{16, 784});
  CHECK(g.value(sum.value).type.dims[1].name == "d");  // the named dim wins
  ValueId other = g.add_input("o", f32({10}), {});
  Built mismatch = b.add(Op::Add, {x, other});
  REQUIRE_FALSE(mismatch.ok());
  CHECK(mismatch.error.find("'d' (784) vs 10") != std::string::npos);
}

TEST_CASE("verifier catches what passes might break") {
  Graph g;
  ValueId x = g.add_input("x", f32({2, 2}), {});
  Builder b(g);
  ValueId e = b.must(b.add(Op::Exp, {x}));
  ValueId s = b.must(b.add(Op::Add, {e, x}));
  g.outputs.emplace_back("out", s);
  CHECK(verify(g).empty());

  SUBCASE("a schedule that is not topological") {
    std::swap(g.mutable_schedule()[0], g.mutable_schedule()[1]);
    auto problems = verify(g);
    REQUIRE_FALSE(problems.empty());
    CHECK(problems[0].find("before it is defined") != std::string::npos);
  }
  SUBCASE("a type that no longer matches the rule") {
    g.value(s).type = f32({2, 3});
    g.value(s).layout = contiguous_layout({2, 3});
    auto problems = verify(g);
    REQUIRE_FALSE(problems.empty());
    CHECK(problems[0].find("its rule gives") != std::string::npos);
  }
  SUBCASE("a view that does not alias its input") {
    ValueId t = b.must(b.permute(x, {1, 0}));
    g.value(t).storage = t;
    CHECK_FALSE(verify(g).empty());
  }
  SUBCASE("an erased node that is still used") {
    g.node(g.value(e).producer).erased = true;
    CHECK_FALSE(verify(g).empty());
  }
}

TEST_CASE("printer: stable text, unique names") {
  Graph g;
  g.name = "tiny";
  ValueId x = g.add_input("x", f32({2}), {});
  Builder b(g);
  ValueId y = b.must(b.add(Op::Exp, {x}));
  g.value(y).name = "y";
  g.outputs.emplace_back("loss", y);
  CHECK(print_graph(g) ==
        "graph \"tiny\" {\n"
        "  input %x: f32[2]\n"
        "  %y = exp(%x) : f32[2]\n"
        "  output loss = %y\n"
        "}\n");
}
