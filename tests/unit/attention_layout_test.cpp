// passes/attention_layout: the fused attention of GPT-style models stores o
// as [batch, seq, heads, head_dim], where the head merge copied it, its
// gradient writes dq, dk and dv into the fused qkv's gradient where the
// concat put them, and a compiled step gives the same bits as with the copy
// and the concat.
#include <doctest/doctest.h>

#include <string>

#include "passes/pipeline.h"
#include "support/compiled_step.h"
#include "support/test_models.h"

namespace napkin {
namespace {

ir::Graph compile(const std::string& model, ir::PrecisionPolicy precision, bool layout) {
  passes::PipelineOptions options;
  options.attention_layout = layout;
  return testing::compile_small_model(testing::source_path("models/" + model + ".yaml"), precision, options);
}

TEST_CASE("attention_layout: the attention stores o seq-major, its gradient reads a view and packs dq, dk, dv, no copy or concat is left") {
  for (const char* model : {"gpt", "gpt2-124m", "lm-gqa"}) {
    CAPTURE(model);
    const ir::Graph before = compile(model, ir::PrecisionPolicy::BF16Mixed, false);
    const ir::Graph after = compile(model, ir::PrecisionPolicy::BF16Mixed, true);
    auto count = [](const ir::Graph& g, ir::Op op, ir::Phase phase) {
      int n = 0;
      for (ir::NodeId id : g.schedule()) n += g.node(id).op == op && g.node(id).phase == phase;
      return n;
    };
    const int attentions = count(after, ir::Op::Attention, ir::Phase::Forward);
    REQUIRE(attentions > 0);
    CHECK(count(after, ir::Op::Copy, ir::Phase::Forward) == count(before, ir::Op::Copy, ir::Phase::Forward) - attentions);
    const bool grouped = std::string(model) == "lm-gqa";
    CHECK(count(after, ir::Op::Concat, ir::Phase::Backward) ==
          count(before, ir::Op::Concat, ir::Phase::Backward) - (grouped ? 0 : attentions));
    for (ir::NodeId id : after.schedule()) {
      const ir::Node& n = after.node(id);
      if (n.op == ir::Op::Attention) {
        CHECK(n.attrs.get_int("seq_major_out") == 1);
        const ir::TensorType& q = after.value(n.in(0)).type;
        const std::vector<int64_t> o = after.value(n.out()).type.sizes();
        CHECK(o == std::vector<int64_t>{q.sizes()[0], q.sizes()[2], q.sizes()[1], q.sizes()[3]});
      }
      if (n.op == ir::Op::AttentionGrad) {  // o as [B, H, T, D] again: a permuted view of the stored [B, T, H, D]
        const ir::Value& o = after.value(n.in(3));
        CHECK(o.is_view());
        CHECK(o.type.same_shape(after.value(n.in(0)).type));
        // dq, dk, dv packed as the fused qkv's gradient [B, T, 3, H, D], where heads == kv heads (not lm-gqa's).
        const bool grouped = after.value(n.in(1)).type.sizes()[1] != after.value(n.in(0)).type.sizes()[1];
        CHECK(n.attrs.has("packed_grad") == !grouped);
        if (!grouped) {
          REQUIRE(n.outputs.size() == 1);
          const std::vector<int64_t> q = after.value(n.in(0)).type.sizes();
          CHECK(after.value(n.out()).type.sizes() == std::vector<int64_t>{q[0], q[2], 3, q[1], q[3]});
        }
      }
    }
  }
}

TEST_CASE("attention_layout: one compiled step gives the same bits with and without the pass") {
  for (ir::PrecisionPolicy precision : {ir::PrecisionPolicy::FP32, ir::PrecisionPolicy::BF16Mixed}) {
    for (const char* model : {"gpt", "gpt2-124m", "lm-gqa"}) {
      CAPTURE(model);
      CAPTURE(ir::precision_name(precision));
      testing::CompiledStep a(compile(model, precision, false)), b(compile(model, precision, true));
      CHECK(b.plan.kernels.size() < a.plan.kernels.size());
      CHECK(testing::run_step(a) == testing::run_step(b));
      CHECK(testing::check_same_state_bits(a, b) > 10);
    }
  }
}

}  // namespace
}  // namespace napkin
