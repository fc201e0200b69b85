#include "support/compiled_step.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "codegen/cpu/cpu_backend.h"
#include "codegen/program_json.h"
#include "interp/interpreter.h"
#include "interp/kernels.h"
#include "interp/rounding.h"
#include "ir/internal_check.h"
#include "runtime/rng.h"

namespace napkin::testing {

CompiledStep::CompiledStep(ir::Graph graph, int threads) : g(std::move(graph)) {
  plan = codegen::plan_kernels(g);
  codegen::cpu::CpuModule m = codegen::cpu::emit_module(plan, g.name);
  json = codegen::program_json(g, plan, m.loops, {});
  codegen::cpu::add_program_json(m, json);
  jit = std::make_unique<codegen::cpu::JitModule>(
      std::move(m), std::map<std::string, void*>{{"napkin_rt_bad_index", reinterpret_cast<void*>(&napkin_rt_bad_index)}});
  auto* fns = static_cast<const runtime::KernelCode*>(jit->lookup("napkin_kernel_fns"));
  program = runtime::parse_program(json.data(), json.size());
  ex = std::make_unique<runtime::Executor>(program, fns, threads);

  values = interp::initial_values(g, 7);
  for (auto& [v, data] : interp::random_inputs(g, 11)) values[v] = data;
  runtime::Rng noise(3, 0);
  for (const ir::Param& p : g.params)
    for (double& x : values[p.value]) x += 0.1 * noise.normal();
  for (const codegen::PlannedTensor& t : plan.tensors) {
    ir::ValueId v = ir::kNoValue;
    for (ir::ValueId id : g.inputs) v = g.value(id).name == t.name ? id : v;
    for (const ir::Param& p : g.params) v = g.value(p.value).name == t.name ? p.value : v;
    if (t.role == codegen::TensorRole::Rng) v = g.rng;
    if (v == ir::kNoValue) continue;
    for (size_t i = 0; i < values[v].size(); ++i)
      runtime::write_element(ex->arena() + t.byte_offset, runtime::parse_dtype(ir::dtype_name(t.dtype)), static_cast<int64_t>(i),
                             values[v][i]);
  }
}

std::vector<double> read_operand(const char* arena, const codegen::Operand& o) {
  std::vector<double> out;
  out.reserve(o.numel());
  const runtime::DType dtype = runtime::parse_dtype(ir::dtype_name(o.dtype));
  std::vector<int64_t> idx(o.sizes.size(), 0);
  for (int64_t n = 0; n < o.numel(); ++n) {
    int64_t e = 0;
    for (size_t d = 0; d < idx.size(); ++d) e += idx[d] * o.strides[d];
    out.push_back(runtime::read_element(arena + o.byte_offset, dtype, e));
    for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[d] < o.sizes[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

double scaled_error(const std::vector<double>& got, const std::vector<double>& want) {
  double scale = 1e-3, err = 0;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(want[i]) || !std::isfinite(got[i])) {
      bool same = (std::isnan(want[i]) && std::isnan(got[i])) || want[i] == got[i];
      if (!same) return INFINITY;
      continue;
    }
    err = std::max(err, std::fabs(got[i] - want[i]) / scale);
  }
  return err;
}

double kernel_tolerance(ir::DType t) {
  switch (t) {
    case ir::DType::F64: return 1e-12;
    case ir::DType::F32: return 4e-6;  // measured worst: 5.9e-7 (gpt einsum)
    case ir::DType::BF16: return 2.0 / 256;
    case ir::DType::F16: return 2.0 / 2048;
    default: return 0;
  }
}

namespace {

// The interpreter's outputs of kernel k (of its batch member `member`) from
// its inputs as they are in the arena.
std::vector<std::vector<double>> expected_outputs(const CompiledStep& step, const codegen::Kernel& k, size_t member = 0) {
  const std::vector<codegen::Operand>& operands = k.batch.empty() ? k.inputs : k.batch[member].inputs;
  std::vector<std::vector<double>> inputs;
  for (const codegen::Operand& in : operands) inputs.push_back(read_operand(step.ex->arena(), in));
  if (!k.fused) {
    std::vector<interp::detail::Arg> args;
    for (size_t j = 0; j < inputs.size(); ++j) args.push_back({k.inputs[j].sizes, k.inputs[j].dtype, inputs[j]});
    std::vector<interp::detail::OutType> outs{{k.output.sizes, k.output.dtype}};
    for (const codegen::Operand& o : k.extra_outputs) outs.push_back({o.sizes, o.dtype});
    if (k.bias_grad != ir::kNoNode) outs.pop_back();  // the GEMM's bias gradient: its reduction node's, below
    std::vector<std::vector<double>> out = interp::detail::eval_node(step.g.node(k.node), args, outs);
    out.resize(std::min(out.size(), outs.size()));  // cached_attention's caches: writes into its inputs, not outputs
    if (k.bias_grad != ir::kNoNode) {
      outs.push_back({k.extra_outputs[0].sizes, k.extra_outputs[0].dtype});
      out.push_back(interp::detail::eval_node(step.g.node(k.bias_grad), {args[1]}, {outs.back()}).at(0));
    }
    for (size_t i = 0; i < out.size(); ++i)
      for (double& x : out[i]) x = interp::round_to_dtype(x, outs[i].dtype);
    return out;
  }
  std::vector<std::vector<double>> results;  // per member, in order
  for (size_t i = 0; i < k.fused->ops.size(); ++i) {
    const codegen::FusedOp& op = k.fused->ops[i];
    const ir::Node& n = step.g.node(k.batch.empty() ? op.node : k.batch[member].nodes.at(i));
    std::vector<interp::detail::Arg> args;
    for (size_t j = 0; j < op.args.size(); ++j) {
      const codegen::FusedArg& a = op.args[j];
      if (a.input) args.push_back({operands[a.index].sizes, operands[a.index].dtype, inputs[a.index]});
      else args.push_back({step.g.value(n.in(static_cast<int>(j))).type.sizes(), k.fused->ops[a.index].dtype, results[a.index]});
    }
    results.push_back(interp::detail::eval_node(n, args, {{step.g.value(n.out()).type.sizes(), op.dtype}}).at(0));
    for (double& x : results.back()) x = interp::round_to_dtype(x, op.dtype);
  }
  std::vector<std::vector<double>> outputs;
  for (int o : k.fused->output_ops) outputs.push_back(results[o]);
  return outputs;
}

// See KernelOutputCheck::precision.
ir::DType judged_precision(const codegen::Kernel& k, int output) {
  // Attention's outputs are as exact as its operands: lse is f32 but comes from bf16 q and k.
  if (k.kind == codegen::KernelKind::Attention) return k.inputs[0].dtype;
  if (!k.fused) return k.output.dtype;
  const codegen::FusedLoop& f = *k.fused;
  const codegen::FusedOp& op = f.ops[f.output_ops[output]];
  ir::DType own = f.outputs[output].dtype;
  if (op.op != ir::Op::Cast || op.args[0].input) return own;
  ir::DType from = f.ops[op.args[0].index].dtype;
  bool narrower = ir::is_floating(from) && ir::is_floating(own) && ir::dtype_size(from) < ir::dtype_size(own);
  return narrower ? from : own;
}

}  // namespace

void check_each_kernel(CompiledStep& step, const std::function<void(const KernelOutputCheck&)>& check,
                       const LoopKernelRunner& run_loop_kernel) {
  std::vector<std::vector<std::vector<double>>> expected;  // per batch member (one for other kernels), per output
  // The alternative run's arena: 64-byte aligned like the executor's.
  const size_t arena_bytes = static_cast<size_t>((step.program.arena_bytes + 63) / 64 * 64 + 64);
  std::unique_ptr<char, decltype(&std::free)> copy(
      run_loop_kernel ? static_cast<char*>(std::aligned_alloc(64, arena_bytes)) : nullptr, &std::free);
  auto alternative = [&](int i) { return run_loop_kernel && step.plan.kernels[i].kind != codegen::KernelKind::Gemm; };
  step.ex->before_kernel = [&](int i) {
    const codegen::Kernel& k = step.plan.kernels[i];
    expected.clear();
    for (size_t m = 0; m < std::max<size_t>(k.batch.size(), 1); ++m) expected.push_back(expected_outputs(step, k, m));
    if (!alternative(i)) return;
    std::memcpy(copy.get(), step.ex->arena(), arena_bytes - 64);
    run_loop_kernel(i, copy.get());
  };
  step.ex->after_kernel = [&](int i) {
    const codegen::Kernel& k = step.plan.kernels[i];
    const char* arena = alternative(i) ? copy.get() : step.ex->arena();
    for (size_t m = 0; m < expected.size(); ++m) {
      std::vector<const codegen::Operand*> outputs;
      if (!k.batch.empty())
        for (const codegen::Operand& o : k.batch[m].outputs) outputs.push_back(&o);
      else if (k.fused)
        for (const codegen::Operand& o : k.fused->outputs) outputs.push_back(&o);
      else
        outputs.push_back(&k.output);
      for (const codegen::Operand& o : k.extra_outputs) outputs.push_back(&o);
      NAPKIN_INTERNAL_CHECK(outputs.size() == expected[m].size(), "kernel {} stores {} outputs, the interpreter made {}", k.name,
                            outputs.size(), expected[m].size());
      for (size_t o = 0; o < outputs.size(); ++o)
        check({&k, static_cast<int>(o), outputs[o], scaled_error(read_operand(arena, *outputs[o]), expected[m][o]),
               judged_precision(k, static_cast<int>(o))});
    }
  };
  step.ex->run_forward();
  step.ex->run_rest();
  step.ex->before_kernel = nullptr;
  step.ex->after_kernel = nullptr;
}

double run_step(CompiledStep& step) {
  step.ex->run_forward();
  const double loss = step.ex->loss();
  step.ex->run_rest();
  step.ex->apply_updates();
  return loss;
}

namespace {

// Calls fn(ta, tb) for every parameter and piece of optimizer state of `a`
// with its namesake in `b` (REQUIREd, with the same byte size).
template <class Fn>
void for_each_state_pair(const CompiledStep& a, const CompiledStep& b, Fn fn) {
  for (const codegen::PlannedTensor& ta : a.plan.tensors) {
    if (ta.role != codegen::TensorRole::Param && ta.role != codegen::TensorRole::State) continue;
    const codegen::PlannedTensor* tb = nullptr;
    for (const codegen::PlannedTensor& t : b.plan.tensors) tb = t.name == ta.name ? &t : tb;
    REQUIRE(tb != nullptr);
    REQUIRE(tb->bytes == ta.bytes);
    fn(ta, *tb);
  }
}

}  // namespace

int check_same_state_bits(CompiledStep& a, CompiledStep& b) {
  int compared = 0;
  for_each_state_pair(a, b, [&](const codegen::PlannedTensor& ta, const codegen::PlannedTensor& tb) {
    INFO(ta.name);
    CHECK(std::memcmp(a.ex->arena() + ta.byte_offset, b.ex->arena() + tb.byte_offset, static_cast<size_t>(ta.bytes)) == 0);
    ++compared;
  });
  return compared;
}

double worst_state_error(CompiledStep& a, CompiledStep& b) {
  double worst = 0;
  for_each_state_pair(a, b, [&](const codegen::PlannedTensor& ta, const codegen::PlannedTensor& tb) {
    codegen::Operand oa{ir::kNoValue, ta.dtype, ta.byte_offset, ta.shape, ir::contiguous_layout(ta.shape).strides};
    codegen::Operand ob = oa;
    ob.byte_offset = tb.byte_offset;
    worst = std::max(worst, scaled_error(read_operand(b.ex->arena(), ob), read_operand(a.ex->arena(), oa)));
  });
  return worst;
}

LossAndGradients evaluate_f64(const ir::Graph& g, const std::map<ir::ValueId, std::vector<double>>& inputs) {
  std::map<ir::ValueId, std::vector<double>> values = interp::initial_values(g, 7);
  for (auto& [v, data] : interp::random_inputs(g, 11)) values[v] = data;
  for (const auto& [v, data] : inputs) values[v] = data;
  interp::Interpreter it(g, interp::Numerics::Float64);
  it.set(values);
  it.run();
  LossAndGradients e;
  e.loss = it.get(g.find_output("loss"))[0];
  for (const ir::Param& p : g.params) {
    const std::string name = g.value(p.value).name;
    e.grads[name] = it.get(g.find_output("grad." + name));
  }
  return e;
}

LossAndGradients evaluate_compiled(ir::Graph g) {
  CompiledStep step(std::move(g));
  step.ex->run_forward();
  LossAndGradients e;
  e.loss = step.ex->loss();
  step.ex->run_backward();
  for (const codegen::PlannedGradient& grad : step.plan.gradients) {
    const int64_t n = grad.bytes / static_cast<int64_t>(ir::dtype_size(grad.dtype));
    codegen::Operand o{ir::kNoValue, grad.dtype, grad.byte_offset, {n}, {1}};
    e.grads[grad.param] = read_operand(step.ex->arena(), o);
  }
  return e;
}

double check_same_loss_and_gradients(const LossAndGradients& want, const LossAndGradients& got, double tolerance) {
  const double loss_error = std::fabs(got.loss - want.loss) / std::fabs(want.loss);
  CHECK(loss_error <= tolerance);
  double worst = loss_error;
  REQUIRE(got.grads.size() == want.grads.size());
  for (const auto& grad : want.grads) {
    const std::string& name = grad.first;
    CAPTURE(name);
    REQUIRE(got.grads.count(name) == 1);
    const double error = scaled_error(got.grads.at(name), grad.second);
    CHECK(error <= tolerance);
    worst = std::max(worst, error);
  }
  return worst;
}

}  // namespace napkin::testing
