// ir/use_list.h: readers by value and by storage, and escaping buffers, on a
// graph small enough to list every use by hand.
#include <doctest/doctest.h>

#include "ir/builder.h"
#include "ir/use_list.h"

using namespace napkin::ir;

TEST_CASE("use list: readers by value count a view once, readers by storage count what reads the view") {
  Graph g;
  TensorType t34;
  t34.dims = {{3, ""}, {4, ""}};
  const ValueId x = g.add_input("x", t34, {});
  const ValueId w = g.add_param("w", t34, {}, {});
  Builder b(g);
  const ValueId a = b.must(b.add(Op::Exp, {x}));
  const ValueId t = b.must(b.permute(a, {1, 0}));  // a view of a
  const ValueId u = b.must(b.add(Op::Neg, {t}));    // reads a's buffer through the view
  const ValueId m = b.must(b.add(Op::Mul, {a, a}));  // two uses of a
  const ValueId o = b.must(b.add(Op::Neg, {u}));
  const NodeId view = g.value(t).producer, neg = g.value(u).producer, mul = g.value(m).producer, last = g.value(o).producer;
  g.outputs.emplace_back("out", t);  // a view of a outlives the step: a's buffer does
  g.outputs.emplace_back("o", o);
  g.updates.push_back({w, m});

  const UseList uses(g);
  CHECK(uses.readers(a) == std::vector<NodeId>{view, mul, mul});
  CHECK(uses.buffer_readers(a) == std::vector<NodeId>{view, neg, mul, mul});
  CHECK(uses.readers(t) == std::vector<NodeId>{neg});
  CHECK(uses.buffer_readers(t) == uses.buffer_readers(a));  // a view's buffer is its storage's
  CHECK(uses.read_through_view(a));
  CHECK_FALSE(uses.read_through_view(u));
  CHECK(uses.readers(o).empty());

  CHECK(uses.escapes(a));  // through the output view
  CHECK(uses.escapes(t));
  CHECK(uses.escapes(m));  // an update's source
  CHECK(uses.escapes(o));
  CHECK_FALSE(uses.escapes(x));
  CHECK_FALSE(uses.escapes(u));

  CHECK(uses.single(u));  // read by `last` alone
  CHECK(uses.single_buffer(u));
  CHECK(uses.readers(u) == std::vector<NodeId>{last});
  CHECK_FALSE(uses.single(t));  // one reader, but the step outputs it
  CHECK_FALSE(uses.single(m));
}
