// Gradient checking: every parameter gradient a training graph computes,
// compared with float64 central differences of its loss. The engine behind
// `napkin check` and the per-op VJP tests.
//
// Terms:
//  - the point: inputs from random_inputs(g, seed); parameters at their
//    initial values plus N(0, s²) noise (s = half the init's std, or 0.1 for
//    constant inits), so gains of 1 and zero biases do not hide a wrong rule.
//  - analytic gradient: the graph's "grad.<param>" output, computed by the
//    interpreter in Float64 and, separately, in Native numerics (the graph's
//    own dtypes).
//  - numeric gradient: the five-point central difference
//    (8·(L(p + h·e) − L(p − h·e)) − (L(p + 2h·e) − L(p − 2h·e))) / 12h, with the
//    forward phase alone in Float64, h = 1e-4·max(1, |p|); e a unit vector (a
//    sampled element) or a random ±1 direction over the whole tensor. Its
//    error is O(h⁴); what is left is rounding in L, ~1e-15·|L| / 12h ≈ 1e-11
//    absolute, which relative to a small gradient entry reaches ~1e-6.
//  - relative error: |analytic − numeric| / max(|analytic|, |numeric|, floor),
//    floor = 1e-3 · the tensor's largest analytic |gradient| (for a direction:
//    1e-3 · Σ|gradient|), so entries that are nearly zero relative to the rest
//    of the tensor are judged on the tensor's scale, not their own.
//  - tolerance: 1e-5 for the Float64 analytic gradient (the rule itself: a
//    wrong rule is off by O(1), the numeric gradient's own error is < 1e-6);
//    for Native, native_tolerance(dtype) of the parameter's dtype, or under a
//    mixed precision policy of the dtype its gradient is computed in (bf16,
//    f16; fp8 for fp8-mixed).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace napkin::interp {

struct GradCheckOptions {
  uint64_t seed = 0;
  int samples = 4;      // elements per tensor checked one by one (all of them if the tensor is smaller)
  bool native = true;   // also check the gradient computed in the graph's own dtypes
};

struct TensorCheck {
  std::string name;
  ir::TensorType type;
  int elements_checked = 0;
  double max_error_f64 = 0;     // over the sampled elements and the random direction
  double max_error_native = 0;  // the same for the Native gradient (0 unless checked)
  double tolerance_f64 = 0;
  double tolerance_native = 0;
  bool passed = false;
};

struct GradCheckResult {
  double loss = 0;  // Float64 loss at the point
  std::vector<TensorCheck> tensors;  // g.params order; params without a gradient are skipped
  int forward_evaluations = 0;
  bool passed = false;
};

// The Native tolerance for a parameter of `dtype` (see the header comment).
double native_tolerance(ir::DType dtype);

// The pieces of the check, for tests that choose their own points:
// |analytic − numeric| / max(|analytic|, |numeric|, floor) (0 if all are 0);
double relative_error(double analytic, double numeric, double floor);
// the five-point stencil above, from L at base + step·direction;
double five_point_derivative(const std::function<double(double step)>& loss_at, double h);
// the graph with only its forward phase scheduled: L(params) and nothing else.
ir::Graph forward_phase(const ir::Graph& g);

// `g` is a training graph: a "loss" output and "grad.<param>" outputs
// (autodiff). Throws std::runtime_error for data errors the interpreter finds.
GradCheckResult check_gradients(const ir::Graph& g, const GradCheckOptions& options);

}  // namespace napkin::interp
