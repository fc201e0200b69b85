// One training step of a model compiled by the CPU backend (LLVM, JIT) and run
// by the runtime's executor, with the reference interpreter beside it: the
// numeric tests use it to check every kernel on its own inputs.
//
// A kernel's expected outputs: before it runs, its inputs are read from the
// arena and the interpreter (interp::detail::eval_node) computes its node from
// exactly those inputs, rounded to the output dtype; a fused kernel (a fusion
// group, ir/fusion_group.h) is the group's nodes evaluated in order, each
// result rounded to its dtype, and every output the kernel stores is checked.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "codegen/cpu/jit.h"
#include "codegen/plan.h"
#include "ir/graph.h"
#include "runtime/executor.h"
#include "runtime/program.h"

namespace napkin::testing {

struct CompiledStep {
  ir::Graph g;
  codegen::KernelPlan plan;
  std::string json;
  std::unique_ptr<codegen::cpu::JitModule> jit;
  runtime::Program program;
  std::unique_ptr<runtime::Executor> ex;
  // Initial params (init plus 0.1 N(0,1) noise, so unit gains and zero biases
  // cannot hide a wrong rule), random inputs and the rng tensor (training step
  // 0, interp::random_inputs), written into the arena.
  std::map<ir::ValueId, std::vector<double>> values;

  explicit CompiledStep(ir::Graph graph, int threads = 2);
};

// The elements of an operand (a view read by its strides), as doubles.
std::vector<double> read_operand(const char* arena, const codegen::Operand& o);

// Largest |got - want| over the tensor, relative to the tensor's largest
// |want| (at least 1e-3, so a tensor of tiny values is judged absolutely):
// kernels may sum in another order than the interpreter, which moves every
// element by a few ulps of the tensor's scale, not of the element. Infinite
// when a non-finite value differs.
double scaled_error(const std::vector<double>& got, const std::vector<double>& want);

// How far a kernel's output may be from the interpreter's, in scaled_error
// units. Both sides round the result to the output dtype once (the kernel
// after an f32 computation, an f32-accumulated GEMM included; the
// interpreter after a float64 one), so a result differs by at most one ulp
// where the two land on either side of a rounding boundary, plus f32
// summation error: for f32, a few ulps of the tensor's scale times the
// longest sum (<= 64 at the test dims); for the narrow floats two ulps of the
// scale; f64 far tighter; integers, bool and fp8 casts of identical inputs
// exactly.
double kernel_tolerance(ir::DType t);

// One checked output of one kernel.
struct KernelOutputCheck {
  const codegen::Kernel* kernel = nullptr;
  int output = 0;  // index among the kernel's stored outputs
  const codegen::Operand* operand = nullptr;
  double error = 0;  // scaled_error against the interpreter
  // The dtype whose tolerance the output is judged by: its own, except for a
  // fused kernel's output that widens a narrower float computed in the
  // kernel (a bf16 result cast to f32 carries bf16's rounding, not f32's).
  ir::DType precision = ir::DType::F32;
};

// Runs loop kernel `kernel` of the plan over `arena` instead of the CPU
// backend's code (the CUDA tests run the kernel's emulated CUDA launches).
using LoopKernelRunner = std::function<void(int kernel, char* arena)>;

// Runs one training step (forward, backward, the update applied); returns its loss.
double run_step(CompiledStep& step);

// CHECKs that every parameter and piece of optimizer state of `a` has the
// same bits in `b` (matched by name, same size); returns how many it compared.
int check_same_state_bits(CompiledStep& a, CompiledStep& b);
// The largest scaled_error of `b`'s parameters and optimizer state against `a`'s (matched by name).
double worst_state_error(CompiledStep& a, CompiledStep& b);

// Runs the step (forward, backward, update) kernel by kernel and calls
// `check` for every output of every kernel. With `run_loop_kernel`, each loop
// kernel also runs through it over a copy of the arena as it is before the
// kernel, and `check` sees that copy's outputs instead of the CPU's; the
// step itself goes on with the CPU's, so every kernel is checked on its own
// inputs.
void check_each_kernel(CompiledStep& step, const std::function<void(const KernelOutputCheck&)>& check,
                       const LoopKernelRunner& run_loop_kernel = nullptr);

// A training graph's loss and every parameter's gradient ("grad.NAME"),
// before the update: what two ways of writing one model must agree on.
struct LossAndGradients {
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;
};
// From the float64 interpreter: parameters from their init (seed 7), random
// inputs (seed 11), or `inputs` where given (by value).
LossAndGradients evaluate_f64(const ir::Graph& g, const std::map<ir::ValueId, std::vector<double>>& inputs = {});
// From the compiled CPU trainer (f32).
LossAndGradients evaluate_compiled(ir::Graph g);
// CHECKs the loss (relative) and each gradient (scaled_error) within
// `tolerance`; returns the largest of those errors.
double check_same_loss_and_gradients(const LossAndGradients& want, const LossAndGradients& got, double tolerance);

}  // namespace napkin::testing
