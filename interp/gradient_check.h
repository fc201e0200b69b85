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
//  - a mixture of experts' routing (the integer outputs of top_k and
//    moe_slots) is piecewise constant: where a stencil's step changes it at
//    any of its four points (a token's k-th and (k+1)-th experts near a tie),
//    the step is taken again ten times smaller, up to four times, and judged
//    at the step it took (the tolerance grows with its rounding).
//  - relative error: |analytic − numeric| / max(|analytic|, |numeric|, floor),
//    floor = 1e-3 · the tensor's largest analytic |gradient| (for a direction:
//    1e-3 · Σ|gradient|), so entries that are nearly zero relative to the rest
//    of the tensor are judged on the tensor's scale, not their own.
//  - the finite difference's own error: rounding in L, not O(h⁴), is what
//    is left, and how much depends on the model's conditioning (how far
//    rounding moves L, the step, the entry's size): an attention weight whose
//    gradient is 1e-6 of its tensor's at init, with L near 5, sees errors
//    near 1e-5 relative. So the check measures it: δ, the RMS by which
//    float64 rounding moves L at the point (8 forward runs with random
//    rounding, interpreter.h), gives the stencil's error e = sqrt(130)/12 ·
//    δ / h per entry (four values of L, each off by δ, independently).
//  - tolerance (Float64), per checked entry: 1e-5 + kNoiseFactor · e / scale,
//    scale the relative error's denominator: for the rule itself, a wrong
//    rule is off by O(1) (and a rule off by 1e-4 still fails where the
//    difference is well conditioned); what rounding in the finite difference
//    explains is not an error of the rule.
//  - the Native point: under dynamic loss scaling (fp16-mixed) the step's
//    Inf/NaN skips are replayed first, as a trainer would (the first steps at
//    the initial scale can overflow f16): GradCheckResult::loss_scale.
//  - rounding noise (Native): how much the graph's own roundings move each
//    checked gradient entry. The Native step runs `noise_runs` more times
//    with random rounding (interpreter.h: every value that rounding changes
//    is rounded up or down at random, CESTAC-style), and an entry's noise is
//    the RMS of its deviation from the plain Native entry over those runs: a
//    Monte Carlo propagation of every op's rounding error through the whole
//    op chain, forward and backward, casts, fp8 quantization and loss
//    scaling included, by the interpreter's own kernels.
//  - tolerance (Native), per checked entry:
//    the Float64 tolerance + kNoiseFactor · noise / scale: the numeric
//    gradient's error plus kNoiseFactor (10) times what the roundings explain. A correct graph stays within a few noise
//    units (models/ in every policy: under 3). What rounding in the normal
//    range cannot explain fails: a gradient off by a factor (a missing or
//    doubled loss-scale unscale), Inf/NaN, values that underflow into
//    subnormals or to zero (only the normal range is randomized), as an f16
//    backward without loss scaling or a gradient unscaled in f16 does. The
//    check does not judge whether a cast's dtype is the intended one (the AMP
//    audit of `napkin report` lists every cast): an error the graph's own
//    dtypes produce is accepted, however large; a tolerance near or above 1
//    says that entry is mostly rounding noise.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "interp/interpreter.h"
#include "ir/graph.h"

namespace napkin::interp {

struct GradCheckOptions {
  uint64_t seed = 0;
  int samples = 4;      // elements per tensor checked one by one (all of them if the tensor is smaller)
  bool native = true;   // also check the gradient computed in the graph's own dtypes
  int noise_runs = 8;   // Native runs with rounding noise that measure its tolerance
};

struct TensorCheck {
  std::string name;
  ir::TensorType type;
  int elements_checked = 0;
  // The Float64 gradient: its relative error and tolerance at the checked
  // entry nearest to failing (largest error / tolerance; over the sampled
  // elements and the random direction).
  double error_f64 = 0;
  double tolerance_f64 = 0;
  // The Native gradient (0 unless checked): its relative error and tolerance
  // at the checked entry nearest to failing (largest error / tolerance), and
  // that entry's rounding noise relative to its scale.
  double error_native = 0;
  double tolerance_native = 0;
  double noise_native = 0;
  bool passed = false;
};

struct GradCheckResult {
  double loss = 0;  // Float64 loss at the point
  double loss_noise = 0;  // δ: the RMS by which float64 rounding moves it (the header)
  std::vector<TensorCheck> tensors;  // g.params order; params without a gradient are skipped
  int forward_evaluations = 0;
  // Under dynamic loss scaling: the scale the Native gradients were taken at,
  // and how many steps a trainer would have skipped for Inf/NaN before it
  // (settle_loss_scale in gradient_check.cpp); 0 without loss scaling.
  double loss_scale = 0;
  int skipped_steps = 0;
  bool passed = false;
};

// The Float64 tolerance of an entry whose finite difference errs by
// `relative_difference_error` (e / scale), and the Native tolerance of one
// whose rounding noise, relative to the entry's scale, is `relative_noise`
// (see the header comment).
double rule_tolerance(double relative_difference_error);
double native_tolerance(double relative_noise, double relative_difference_error = 0);

// The pieces of the check, for tests that choose their own points:
// |analytic − numeric| / max(|analytic|, |numeric|, floor) (0 if all are 0);
double relative_error(double analytic, double numeric, double floor);
// the five-point stencil above, from L at base + step·direction;
double five_point_derivative(const std::function<double(double step)>& loss_at, double h);
// the graph with only its forward phase scheduled: L(params) and nothing else;
ir::Graph forward_phase(const ir::Graph& g);
// the rounding-noise runs: g in Native numerics at `point`, `runs` times, run r
// with the noise of Rng(seed, r); `visit` reads each run's values.
void run_with_rounding_noise(const ir::Graph& g, const std::map<ir::ValueId, std::vector<double>>& point, int runs,
                             uint64_t seed, const std::function<void(const Interpreter&)>& visit);

// `g` is a training graph: a "loss" output and "grad.<param>" outputs
// (autodiff). Throws std::runtime_error for data errors the interpreter finds.
GradCheckResult check_gradients(const ir::Graph& g, const GradCheckOptions& options);

}  // namespace napkin::interp
