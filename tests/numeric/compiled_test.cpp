// The CPU backend against the reference interpreter, kernel by kernel: every
// model in models/ at small dims is compiled (LLVM, JIT) and run for one
// training step through the runtime's executor; before each kernel its inputs
// are read from the arena, the interpreter computes the node from exactly
// those inputs, and the kernel's output must agree within the dtype's
// tolerance. Each kernel is checked on its own inputs, so an error is pinned
// to one op instead of smeared over the step.
//
// A fused kernel (a fusion group, ir/fusion_group.h) is checked against the
// interpreter evaluating the group's nodes in order from the kernel's inputs,
// each result rounded to its dtype; every output the kernel stores must agree.
//
// NAPKIN_NUMERIC_VERBOSE=1 prints the largest error per model.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <iostream>

#include "codegen/cpu/jit.h"
#include "codegen/program_json.h"
#include "interp/interpreter.h"
#include "interp/kernels.h"
#include "interp/rounding.h"
#include "runtime/executor.h"
#include "runtime/rng.h"
#include "support/test_models.h"

using namespace napkin;

namespace {

std::vector<double> read_operand(const char* arena, const codegen::Operand& o) {
  std::vector<double> out;
  out.reserve(o.numel());
  std::string dtype(ir::dtype_name(o.dtype));
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

// Largest |got - want| over the tensor, relative to the tensor's largest
// |want| (at least 1e-3, so a tensor of tiny values is judged absolutely):
// kernels may sum in another order than the interpreter, which moves every
// element by a few ulps of the tensor's scale, not of the element.
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

// f32 kernels agree to a few ulps of the tensor's scale times the length of
// the longest sum (<= 64 at these dims); f64 ones far tighter.
double tolerance(ir::DType t) {
  switch (t) {
    case ir::DType::F64: return 1e-12;
    case ir::DType::F32: return 4e-6;  // measured worst: 3.6e-7 (gpt einsum)
    case ir::DType::BF16: return 2e-2;
    case ir::DType::F16: return 4e-3;
    default: return 0;  // integers and bool: exact
  }
}

}  // namespace

TEST_CASE("numeric: every model's compiled CPU kernels agree with the interpreter, kernel by kernel") {
  const bool verbose = std::getenv("NAPKIN_NUMERIC_VERBOSE") != nullptr;
  for (const auto& model : napkin::testing::model_files()) {
    const std::string stem = model.stem().string();
    CAPTURE(stem);
    ir::Graph g = napkin::testing::compile_small_model(model);
    codegen::KernelPlan plan = codegen::plan_kernels(g);
    codegen::cpu::CpuModule m = codegen::cpu::emit_module(plan, stem);
    std::string json = codegen::program_json(g, plan, m.loops, {});
    codegen::cpu::add_program_json(m, json);
    codegen::cpu::JitModule jit(std::move(m), {{"napkin_rt_bad_index", reinterpret_cast<void*>(&napkin_rt_bad_index)}});
    auto* fns = static_cast<const runtime::KernelFn*>(jit.lookup("napkin_kernel_fns"));
    runtime::Program program = runtime::parse_program(json.data(), json.size());
    runtime::Executor ex(program, fns, 2);

    // Params: init plus noise (so unit gains and zero biases cannot hide a
    // wrong rule), random data, zero optimizer state.
    auto values = interp::initial_values(g, 7);
    for (auto& [v, data] : interp::random_inputs(g, 11)) values[v] = data;
    runtime::Rng noise(3, 0);
    for (const ir::Param& p : g.params)
      for (double& x : values[p.value]) x += 0.1 * noise.normal();
    for (const codegen::PlannedTensor& t : plan.tensors) {
      ir::ValueId v = ir::kNoValue;
      for (ir::ValueId id : g.inputs) v = g.value(id).name == t.name ? id : v;
      for (const ir::Param& p : g.params) v = g.value(p.value).name == t.name ? p.value : v;
      if (v == ir::kNoValue) continue;
      for (size_t i = 0; i < values[v].size(); ++i)
        runtime::write_element(ex.arena() + t.byte_offset, std::string(ir::dtype_name(t.dtype)), static_cast<int64_t>(i), values[v][i]);
    }

    std::vector<std::vector<double>> expected;  // per output the kernel stores
    double worst = 0;
    std::string worst_kernel;
    int fused_kernels = 0;
    ex.before_kernel = [&](int i) {
      const codegen::Kernel& k = plan.kernels[i];
      std::vector<std::vector<double>> inputs;
      for (const codegen::Operand& in : k.inputs) inputs.push_back(read_operand(ex.arena(), in));
      expected.clear();
      if (!k.fused) {
        std::vector<interp::detail::Arg> args;
        for (size_t j = 0; j < inputs.size(); ++j) args.push_back({k.inputs[j].sizes, k.inputs[j].dtype, inputs[j]});
        expected.push_back(interp::detail::eval_node(g.node(k.node), args, {k.output.sizes, k.output.dtype}));
        for (double& x : expected.back()) x = interp::round_to_dtype(x, k.output.dtype);
        return;
      }
      ++fused_kernels;
      std::vector<std::vector<double>> results;  // per member, in order
      for (const codegen::FusedOp& op : k.fused->ops) {
        const ir::Node& n = g.node(op.node);
        std::vector<interp::detail::Arg> args;
        for (size_t j = 0; j < op.args.size(); ++j) {
          const codegen::FusedArg& a = op.args[j];
          if (a.input) args.push_back({k.inputs[a.index].sizes, k.inputs[a.index].dtype, inputs[a.index]});
          else args.push_back({g.value(n.in(static_cast<int>(j))).type.sizes(), k.fused->ops[a.index].dtype, results[a.index]});
        }
        results.push_back(interp::detail::eval_node(n, args, {g.value(n.out()).type.sizes(), op.dtype}));
        for (double& x : results.back()) x = interp::round_to_dtype(x, op.dtype);
      }
      for (int o : k.fused->output_ops) expected.push_back(results[o]);
    };
    ex.after_kernel = [&](int i) {
      const codegen::Kernel& k = plan.kernels[i];
      std::vector<codegen::Operand> outputs = k.fused ? k.fused->outputs : std::vector<codegen::Operand>{k.output};
      REQUIRE(outputs.size() == expected.size());
      for (size_t o = 0; o < outputs.size(); ++o) {
        double err = scaled_error(read_operand(ex.arena(), outputs[o]), expected[o]);
        INFO(k.name << " output " << o << " at " << k.where << (k.kind == codegen::KernelKind::Matmul ? " (GEMM)" : " (loop)"));
        CHECK(err <= tolerance(outputs[o].dtype));
        if (err > worst) worst = err, worst_kernel = k.name;
      }
    };
    ex.run_forward();
    ex.run_rest();
    CHECK(fused_kernels > 0);  // every model has at least its optimizer update fused
    if (verbose)
      std::cout << fmt::format("{:10} {} kernels ({} fused), worst scaled error {:.2e} ({})\n", stem, plan.kernels.size(),
                               fused_kernels, worst, worst_kernel);
  }
}
