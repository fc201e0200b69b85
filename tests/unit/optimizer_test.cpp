// The optimizer pass, numerically: every rule (sgd, sgd with momentum and
// nesterov, momentum, adagrad, rmsprop with and without momentum, adam, adamw)
// crossed with every option (coupled and decoupled weight decay with a
// no_decay glob, global-norm clipping active and inactive, constant lr with
// warmup, cosine with and without warmup, decaying to min_lr within the run),
// run for five steps in the reference interpreter and compared, parameter and
// state, after every step with an independent reference written here from the
// torch.optim documentation's formulas (not from passes/optimizer.cpp), fed the
// gradients the interpreter computed for that step (in double, and once in
// f32 within f32's rounding). Then fixed-gradient
// trajectories against numbers produced by torch.optim itself
// (bench/optimizer_vs_torch.py), the state's names and types, the step
// counter, no_decay, glob_match, and the optimizer's FLOPs counted by hand.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "analysis/cost.h"
#include "interp/interpreter.h"
#include "passes/optimizer.h"
#include "support/test_models.h"

using namespace napkin;
using interp::Interpreter;
using interp::Numerics;
using ir::ValueId;
using napkin::testing::compile_training;
using Vec = std::vector<double>;

namespace {

// Tolerance. In Numerics::Float64 the interpreter keeps every value in double:
// the optimizer's f32 scalars (t, lr_t, the bias corrections, the clip
// coefficient) are f32 only in their IR type, and Constant nodes hold the
// exact doubles the model gave (lr, betas, eps are not rounded to f32), so the
// pass and the reference below compute the same real numbers and differ only
// by the rounding of differently ordered double arithmetic. Measured: at most
// ~1e-15 relative for state, and for parameters ~1e-15 except elements that
// cancelled to ~1e-4 from O(0.5) (up to 4e-14 relative, ~1e-17 absolute).
// 1e-12 relative is that with room; a wrong formula misses it by orders of
// magnitude (eps inside the square root, clip without its 1e-6, a missing
// nesterov term, a cosine one step off each fail hundreds of checks).
// Numerics::Native (every value, scalars included, rounded to f32 after each
// op) is checked against the same double reference at 1e-5 of each tensor's
// largest element: f32's 6e-8 per op, about ten ops per step, five steps
// (measured: 1.1e-6, Adam's first moment cancelling as a gradient flips sign).
constexpr double kRelTol = 1e-12;
constexpr double kNativeTol = 1e-5;

// Any Input, Param or State value by name.
ValueId named(const ir::Graph& g, const std::string& name) {
  for (const ir::Param& p : g.params)
    if (g.value(p.value).name == name) return p.value;
  for (ValueId v : g.inputs)
    if (g.value(v).name == name) return v;
  for (ValueId v : g.state)
    if (g.value(v).name == name) return v;
  FAIL("no input, param or state named " << name);
  return ir::kNoValue;
}

// |got - want| <= tol·|want| element by element (exact where want is 0).
double check_rel(const Vec& got, const Vec& want, const std::string& what, double tol = kRelTol) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::abs(got[i] - want[i]);
    double rel = want[i] == 0 ? err : err / std::abs(want[i]);
    worst = std::max(worst, rel);
    if (!(rel <= tol)) {
      CAPTURE(what);
      CAPTURE(i);
      CAPTURE(got[i]);
      CAPTURE(want[i]);
      CHECK(rel <= tol);
    }
  }
  return worst;
}

// |got - want| <= tol·max|want| (a tensor's own scale: for f32 results, where
// an element that cancelled towards 0 has no meaningful relative error).
double check_scaled(const Vec& got, const Vec& want, const std::string& what, double tol) {
  REQUIRE(got.size() == want.size());
  double scale = 0, worst = 0;
  for (double x : want) scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::abs(got[i] - want[i]) / (scale == 0 ? 1 : scale);
    worst = std::max(worst, err);
    if (!(err <= tol)) {
      CAPTURE(what);
      CAPTURE(i);
      CAPTURE(got[i]);
      CAPTURE(want[i]);
      CHECK(err <= tol);
    }
  }
  return worst;
}

// ---------------------------------------------------------------------------
// The reference: torch.optim's documented algorithms, in double, one element at
// a time. (https://pytorch.org/docs/stable/optim.html, the pseudocode of SGD,
// Adagrad, RMSprop, Adam and AdamW; clipping as torch.nn.utils.clip_grad_norm_;
// the schedule as docs/model-language.md and passes/optimizer.h define it,
// which torch has no single class for.)

enum class Rule { SGD, Adagrad, RMSprop, Adam, AdamW };

struct Hyper {
  Rule rule = Rule::SGD;
  double lr = 0;
  double momentum = 0;  // SGD, RMSprop
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double alpha = 0.99;
  double weight_decay = 0;
  std::set<std::string> no_decay;  // parameter names (not globs: the reference does not match globs)
  double grad_clip = 0;
  bool cosine = false;
  int warmup = 0;
  double min_lr = 0;
  int steps = 5;  // train.steps
};

class Reference {
 public:
  Reference(Hyper h, std::map<std::string, Vec> params) : h_(std::move(h)), params_(std::move(params)) {}

  const Vec& param(const std::string& name) const { return params_.at(name); }
  // The state torch keeps for `param`, under napkin's name for it.
  const std::map<std::string, Vec>& state() const { return state_; }
  double last_lr() const { return last_lr_; }
  double last_clip_coef() const { return last_clip_coef_; }

  double lr_at(int t) const {
    double lr = h_.lr, w = h_.warmup;
    if (!h_.cosine) return w > 0 ? lr * std::min(1.0, t / w) : lr;
    if (w > 0 && t <= w) return lr * t / w;
    double progress = std::clamp((t - w) / std::max(1.0, h_.steps - w), 0.0, 1.0);
    return h_.min_lr + (lr - h_.min_lr) * (1 + std::cos(std::numbers::pi * progress)) / 2;
  }

  // Step t (1-based) with these gradients.
  void step(int t, std::map<std::string, Vec> grads) {
    double gamma = last_lr_ = lr_at(t);
    last_clip_coef_ = 1;
    if (h_.grad_clip > 0) {
      // clip_grad_norm_: total_norm = ‖(‖g_i‖)_i‖₂; coef = max_norm / (total_norm + 1e-6), clamped to 1.
      double sq = 0;
      for (const auto& [name, g] : grads)
        for (double x : g) sq += x * x;
      last_clip_coef_ = std::min(1.0, h_.grad_clip / (std::sqrt(sq) + 1e-6));
      for (auto& [name, g] : grads)
        for (double& x : g) x *= last_clip_coef_;
    }
    for (auto& [name, grad] : grads) {
      Vec& theta = params_.at(name);
      double lambda = h_.no_decay.count(name) ? 0 : h_.weight_decay;
      for (size_t i = 0; i < theta.size(); ++i) theta[i] = update(t, gamma, lambda, name, i, theta[i], grad[i]);
    }
  }

 private:
  double& slot(const std::string& label, const std::string& name, size_t i) {
    Vec& s = state_[label + "." + name];
    if (s.size() < params_.at(name).size()) s.resize(params_.at(name).size(), 0.0);
    return s[i];
  }

  double update(int t, double gamma, double lambda, const std::string& name, size_t i, double theta, double g) {
    switch (h_.rule) {
      case Rule::SGD: {
        // g ← g + λθ; b ← g (t = 1) or μb + (1 − τ)g with τ = 0; g ← g + μb (nesterov) or b; θ ← θ − γg
        if (lambda != 0) g = g + lambda * theta;
        if (h_.momentum != 0) {
          double& b = slot("momentum.buf", name, i);
          b = t > 1 ? h_.momentum * b + g : g;
          g = h_.nesterov ? g + h_.momentum * b : b;
        }
        return theta - gamma * g;
      }
      case Rule::Adagrad: {
        // γ̃ = γ / (1 + (t − 1)η), η = lr_decay = 0; g ← g + λθ; s ← s + g²; θ ← θ − γ̃ g / (√s + ε)
        double clr = gamma / (1 + (t - 1) * 0.0);
        if (lambda != 0) g = g + lambda * theta;
        double& s = slot("adagrad.sum_sq", name, i);
        s = s + g * g;
        return theta - clr * g / (std::sqrt(s) + h_.eps);
      }
      case Rule::RMSprop: {
        // g ← g + λθ; v ← αv + (1 − α)g²; μ > 0: b ← μb + g / (√v + ε), θ ← θ − γb; else θ ← θ − γ g / (√v + ε)
        if (lambda != 0) g = g + lambda * theta;
        double& v = slot("rmsprop.sq_avg", name, i);
        v = h_.alpha * v + (1 - h_.alpha) * g * g;
        if (h_.momentum > 0) {
          double& b = slot("rmsprop.buf", name, i);
          b = h_.momentum * b + g / (std::sqrt(v) + h_.eps);
          return theta - gamma * b;
        }
        return theta - gamma * g / (std::sqrt(v) + h_.eps);
      }
      case Rule::Adam:
      case Rule::AdamW: {
        // Adam: g ← g + λθ.  AdamW: θ ← θ − γλθ.  Then m ← β₁m + (1 − β₁)g, v ← β₂v + (1 − β₂)g²,
        // m̂ = m / (1 − β₁ᵗ), v̂ = v / (1 − β₂ᵗ), θ ← θ − γ m̂ / (√v̂ + ε)
        if (h_.rule == Rule::Adam) g = g + lambda * theta;
        else theta = theta - gamma * lambda * theta;
        double& m = slot("adam.m", name, i);
        double& v = slot("adam.v", name, i);
        m = h_.beta1 * m + (1 - h_.beta1) * g;
        v = h_.beta2 * v + (1 - h_.beta2) * g * g;
        double m_hat = m / (1 - std::pow(h_.beta1, t));
        double v_hat = v / (1 - std::pow(h_.beta2, t));
        return theta - gamma * m_hat / (std::sqrt(v_hat) + h_.eps);
      }
    }
    return theta;
  }

  Hyper h_;
  std::map<std::string, Vec> params_;
  std::map<std::string, Vec> state_;
  double last_lr_ = 0, last_clip_coef_ = 1;
};

// ---------------------------------------------------------------------------
// The model: y ≈ x @ w + w_b under mse, with fixed data, so every step's
// gradient depends on the parameters the previous steps produced.

std::string tiny_model(const std::string& optimizer, int steps) {
  return R"yaml(
model: tiny
dims: {n: 4, d: 3, k: 2}
inputs:
  x: {shape: [n, d]}
  y: {shape: [n, k]}
params:
  w: {shape: [d, k], init: normal(0.5)}
  w_b: {shape: [k], init: constant(0.25)}
forward:
  - pred: x @ w + w_b
loss: mse(pred, y)
optimizer: )yaml" + optimizer + "\ntrain: {steps: " + std::to_string(steps) + "}\n";
}

const std::vector<std::string> kTinyParams = {"w", "w_b"};

struct RuleCase {
  std::string call;  // the optimizer call without its closing parenthesis
  Hyper hyper;
  std::set<std::string> state_labels;  // napkin's state per parameter
};

Hyper H(Rule r, double lr, std::function<void(Hyper&)> more = {}) {
  Hyper h;
  h.rule = r;
  h.lr = lr;
  if (more) more(h);
  return h;
}

const std::vector<RuleCase>& rule_cases() {
  static const std::vector<RuleCase> cases = {
      {"sgd(lr=0.1", H(Rule::SGD, 0.1), {}},
      {"sgd(lr=0.1, momentum=0.8", H(Rule::SGD, 0.1, [](Hyper& h) { h.momentum = 0.8; }), {"momentum.buf"}},
      {"sgd(lr=0.1, momentum=0.9, nesterov=true",
       H(Rule::SGD, 0.1, [](Hyper& h) { h.momentum = 0.9; h.nesterov = true; }), {"momentum.buf"}},
      {"momentum(lr=0.05", H(Rule::SGD, 0.05, [](Hyper& h) { h.momentum = 0.9; }), {"momentum.buf"}},
      {"momentum(lr=0.05, momentum=0.5, nesterov=true",
       H(Rule::SGD, 0.05, [](Hyper& h) { h.momentum = 0.5; h.nesterov = true; }), {"momentum.buf"}},
      {"adagrad(lr=0.1", H(Rule::Adagrad, 0.1, [](Hyper& h) { h.eps = 1e-10; }), {"adagrad.sum_sq"}},
      {"adagrad(lr=0.1, eps=1e-3", H(Rule::Adagrad, 0.1, [](Hyper& h) { h.eps = 1e-3; }), {"adagrad.sum_sq"}},
      {"rmsprop(lr=0.01", H(Rule::RMSprop, 0.01), {"rmsprop.sq_avg"}},
      {"rmsprop(lr=0.01, alpha=0.9, eps=1e-6, momentum=0.5",
       H(Rule::RMSprop, 0.01, [](Hyper& h) { h.alpha = 0.9; h.eps = 1e-6; h.momentum = 0.5; }),
       {"rmsprop.sq_avg", "rmsprop.buf"}},
      {"adam(lr=0.01", H(Rule::Adam, 0.01), {"adam.m", "adam.v"}},
      {"adam(lr=0.01, betas=[0.8, 0.95], eps=1e-6",
       H(Rule::Adam, 0.01, [](Hyper& h) { h.beta1 = 0.8; h.beta2 = 0.95; h.eps = 1e-6; }), {"adam.m", "adam.v"}},
      {"adamw(lr=0.01", H(Rule::AdamW, 0.01), {"adam.m", "adam.v"}},
      {"adamw(lr=0.02, betas=[0.85, 0.9], eps=1e-7",
       H(Rule::AdamW, 0.02, [](Hyper& h) { h.beta1 = 0.85; h.beta2 = 0.9; h.eps = 1e-7; }), {"adam.m", "adam.v"}},
  };
  return cases;
}

struct OptionCase {
  std::string text;  // appended inside the call
  std::function<void(Hyper&)> apply;
  int steps = 5;  // train.steps
};

const std::vector<OptionCase>& option_cases() {
  static const std::vector<OptionCase> cases = {
      {"", [](Hyper&) {}},
      {"weight_decay=0.05", [](Hyper& h) { h.weight_decay = 0.05; }},
      {"weight_decay=0.3, no_decay=[\"*_b\"]",
       [](Hyper& h) { h.weight_decay = 0.3; h.no_decay = {"w_b"}; }},
      {"grad_clip=0.05", [](Hyper& h) { h.grad_clip = 0.05; }},  // active: the gradients' norm is ~1
      {"grad_clip=1e6", [](Hyper& h) { h.grad_clip = 1e6; }},    // inactive
      {"schedule=constant, warmup=3", [](Hyper& h) { h.warmup = 3; }},
      {"schedule=cosine, min_lr=0.001", [](Hyper& h) { h.cosine = true; h.min_lr = 0.001; }},
      {"schedule=cosine, warmup=2, min_lr=0.002", [](Hyper& h) { h.cosine = true; h.warmup = 2; h.min_lr = 0.002; }},
      // Past train.steps the cosine stays at min_lr (steps 4 and 5 of 3).
      {"schedule=cosine, warmup=1", [](Hyper& h) { h.cosine = true; h.warmup = 1; h.steps = 3; }, 3},
      {"weight_decay=0.1, no_decay=[\"w?b\", \"?_b\"], grad_clip=0.05, schedule=cosine, warmup=1, min_lr=0.001",
       [](Hyper& h) { h.weight_decay = 0.1; h.no_decay = {"w_b"}; h.grad_clip = 0.05; h.cosine = true;
                      h.warmup = 1; h.min_lr = 0.001; }},
  };
  return cases;
}

std::map<ValueId, Vec> fixed_data(const ir::Graph& g) {
  Vec x(12), y(8);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(1.0 + 0.7 * i);
  for (size_t i = 0; i < y.size(); ++i) y[i] = std::cos(0.3 + 1.1 * i);
  return {{named(g, "x"), x}, {named(g, "y"), y}};
}

struct RunSummary {
  double worst_param = 0, worst_state = 0;
  std::vector<double> lrs, clip_coefs;
};

// Compiles the tiny model with `optimizer`, runs `steps` steps in the
// interpreter (Float64) next to the reference, and checks every parameter
// and every state value after every step.
RunSummary run_against_reference(const std::string& optimizer, int train_steps, const Hyper& hyper,
                                 const std::set<std::string>& state_labels,
                                 Numerics numerics = Numerics::Float64, int steps = 5) {
  CAPTURE(optimizer);
  ir::Graph g = compile_training(tiny_model(optimizer, train_steps));
  REQUIRE(g.params.size() == kTinyParams.size());

  // The state napkin made: exactly the rule's, one per parameter, of the parameter's type.
  std::set<std::string> want_state = {"optimizer.step"}, got_state;
  for (const std::string& label : state_labels)
    for (const std::string& p : kTinyParams) want_state.insert(label + "." + p);
  for (ValueId v : g.state) {
    const ir::Value& s = g.value(v);
    CHECK(s.kind == ir::ValueKind::State);
    got_state.insert(s.name);
    if (s.name == "optimizer.step") {
      CHECK(s.type.dtype == ir::DType::I64);
      CHECK(s.type.rank() == 0);
      continue;
    }
    const ir::Value& p = g.value(named(g, s.name.substr(s.name.rfind('.') + 1)));
    CHECK(s.type.dtype == p.type.dtype);
    CHECK(s.type.same_shape(p.type));
  }
  CHECK(got_state == want_state);
  // Every param and every state value is written back exactly once.
  std::map<ValueId, int> targets;
  for (const ir::Graph::Update& u : g.updates) ++targets[u.target];
  CHECK(targets.size() == g.updates.size());
  for (const ir::Param& p : g.params) CHECK(targets.count(p.value) == 1);
  for (ValueId v : g.state) CHECK(targets.count(v) == 1);

  Interpreter it(g, numerics);
  it.set(interp::initial_values(g, 11));
  it.set(fixed_data(g));
  std::map<std::string, Vec> start;  // as set: rounded to f32 in Native mode
  for (const std::string& p : kTinyParams) start[p] = it.get(named(g, p));
  CHECK(start["w"][0] != 0);  // normal(0.5): nonzero, so weight decay has something to decay
  Reference ref(hyper, start);

  RunSummary summary;
  ValueId step = named(g, "optimizer.step");
  for (int t = 1; t <= steps; ++t) {
    CAPTURE(t);
    CHECK(it.get(step) == Vec{double(t - 1)});
    it.run();
    std::map<std::string, Vec> grads;
    for (const std::string& p : kTinyParams) {
      ValueId grad = g.find_output("grad." + p);
      REQUIRE(grad != ir::kNoValue);
      grads[p] = it.get(grad);
    }
    ref.step(t, grads);
    summary.lrs.push_back(ref.last_lr());
    summary.clip_coefs.push_back(ref.last_clip_coef());
    it.apply_updates();
    CHECK(it.get(step) == Vec{double(t)});
    auto check = [&](const Vec& got, const Vec& want, const std::string& what) {
      return numerics == Numerics::Float64 ? check_rel(got, want, what) : check_scaled(got, want, what, kNativeTol);
    };
    for (const std::string& p : kTinyParams)
      summary.worst_param = std::max(summary.worst_param, check(it.get(named(g, p)), ref.param(p), p));
    for (const auto& [name, want] : ref.state())
      summary.worst_state = std::max(summary.worst_state, check(it.get(named(g, name)), want, name));
  }
  return summary;
}

}  // namespace

TEST_CASE("optimizer: every rule with every option matches torch.optim's formulas for five steps") {
  double worst_param = 0, worst_state = 0;
  int runs = 0;
  for (const RuleCase& rule : rule_cases()) {
    for (const OptionCase& option : option_cases()) {
      std::string call = rule.call + (option.text.empty() ? "" : ", " + option.text) + ")";
      Hyper h = rule.hyper;
      option.apply(h);
      RunSummary s = run_against_reference(call, option.steps, h, rule.state_labels);
      worst_param = std::max(worst_param, s.worst_param);
      worst_state = std::max(worst_state, s.worst_state);
      ++runs;
      // The options did what they say, so the comparison above covered them.
      CAPTURE(call);
      if (h.grad_clip == 0.05)
        for (double c : s.clip_coefs) CHECK(c < 0.5);  // clipping active at every step
      if (h.grad_clip == 1e6)
        for (double c : s.clip_coefs) CHECK(c == 1);
      if (h.cosine && h.warmup == 2) {
        // warmup 1/2, 2/2, then cosine from lr down to min_lr at t = steps = 5.
        CHECK(s.lrs[0] == doctest::Approx(h.lr / 2).epsilon(1e-15));
        CHECK(s.lrs[1] == doctest::Approx(h.lr).epsilon(1e-15));
        CHECK(s.lrs[2] < s.lrs[1]);
        CHECK(s.lrs[3] < s.lrs[2]);
        CHECK(s.lrs[4] == doctest::Approx(h.min_lr).epsilon(1e-15));
      }
      if (h.cosine && h.steps == 3) CHECK(s.lrs[4] == 0);
      if (!h.cosine && h.warmup == 3) CHECK(s.lrs[0] == doctest::Approx(h.lr / 3).epsilon(1e-15));
    }
  }
  CHECK(runs == 130);
  MESSAGE("worst relative error, parameters: " << worst_param << ", state: " << worst_state);
}

TEST_CASE("optimizer: in f32 (Native) every rule stays within f32 rounding of the double reference") {
  // Every option at once: decay with no_decay, active clipping, warmup and cosine.
  double worst_param = 0, worst_state = 0;
  const OptionCase& all = option_cases().back();
  for (const RuleCase& rule : rule_cases()) {
    Hyper h = rule.hyper;
    all.apply(h);
    RunSummary s = run_against_reference(rule.call + ", " + all.text + ")", all.steps, h, rule.state_labels,
                                         Numerics::Native);
    worst_param = std::max(worst_param, s.worst_param);
    worst_state = std::max(worst_state, s.worst_state);
  }
  CHECK(worst_param > 0);  // really rounded
  MESSAGE("worst error relative to each tensor's scale, f32: parameters " << worst_param << ", state "
                                                                         << worst_state);
}

// Fixed gradients: loss = sum(w * gw) + sum(b * gb), with gw and gb inputs,
// makes d loss / d w = gw exactly, so the gradient of every step is chosen.
// Expected values: torch.optim itself, float64, pasted from the output of
//   /usr/bin/python3 bench/optimizer_vs_torch.py
// (torch 1.13). `b` is in no_decay where torch gives it weight_decay=0.
TEST_CASE("optimizer: matches torch.optim's trajectories for fixed gradients") {
  const Vec w0 = {0.5, -0.3, 0.8}, b0 = {0.1, -0.2};
  const std::vector<Vec> grads_w = {{0.2, -0.5, 0.1}, {-0.4, 0.3, 0.25}, {0.05, 0.6, -0.35}};
  const std::vector<Vec> grads_b = {{0.3, -0.1}, {0.15, 0.2}, {-0.25, 0.05}};
  struct Step {
    Vec w, b;
  };
  struct Scenario {
    std::string name, optimizer;
    std::vector<Step> steps;
  };
  // clang-format off
  const std::vector<Scenario> scenarios = {
    // Generated by /usr/bin/python3 bench/optimizer_vs_torch.py (torch 1.13.0a0, float64).
    {"adamw", R"(adamw(lr=0.01, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1, no_decay=["b"]))",
     {{{0.4895000005, -0.2897000002, 0.7892000009999999}, {0.09000000033333333, -0.19000000099999992}},
      {{0.4926442398902382, -0.28748388764031796, 0.7790980851702478}, {0.08060707004952204, -0.19363374027670308}},
      {{0.494264324613831, -0.29073389008953027, 0.7789466019644001}, {0.07864380040984424, -0.19780644380451257}}}},
    {"adam", R"(adam(lr=0.02, betas=[0.8, 0.99], eps=1e-6, weight_decay=0.05))",
     {{{0.4800000888884938, -0.28000003883487606, 0.7800001428561225}, {0.0800000655735555, -0.18000018181652894}},
      {{0.4870204630334052, -0.27663460024564934, 0.7604087166381082}, {0.06166886686352635, -0.18733394265006223}},
      {{0.48965723070008194, -0.28492172064840665, 0.760129564952802}, {0.05925928391098293, -0.19513562647934268}}}},
    {"sgd_nesterov", R"(sgd(lr=0.1, momentum=0.9, nesterov=true, weight_decay=0.01))",
     {{{0.46105, -0.20442999999999997, 0.7794800000000001}, {0.04281000000000001, -0.18062}},
      {{0.519569005, -0.22029858299999996, 0.721750988}, {-0.010152338999999998, -0.210014822}},
      {{0.5261638733905001, -0.3213457273923, 0.7581250823228001}, {0.0032393743441000065, -0.22773369163819998}}}},
    {"momentum", R"(momentum(lr=0.05))",
     {{{0.49, -0.27499999999999997, 0.795}, {0.085, -0.195}},
      {{0.501, -0.26749999999999996, 0.778}, {0.064, -0.2005}},
      {{0.5084, -0.29074999999999995, 0.7802}, {0.0576, -0.20795000000000002}}}},
    {"rmsprop_momentum", R"(rmsprop(lr=0.01, alpha=0.9, eps=1e-8, momentum=0.9))",
     {{{0.4683772283983154, -0.26837722539831604, 0.7683772333983131}, {0.0683772267316492, -0.16837723339831306}},
      {{0.4684881604874117, -0.25681981239898993, 0.7103511271538437}, {0.02517253662391897, -0.16848816794659133}},
      {{0.46484977984197, -0.27007063560675887, 0.6837324358725945}, {0.006326824867881826, -0.17591249215844362}}}},
    {"adagrad", R"(adagrad(lr=0.05))",
     {{{0.450000000025, -0.25000000001, 0.75000000005}, {0.05000000001666667, -0.15000000005}},
      {{0.4947213595649958, -0.2757247877769646, 0.7035761655229784}, {0.02763932024833544, -0.1947213595799958}},
      {{0.48916580401067483, -0.31158164605271066, 0.7432058617090649}, {0.05752003547455242, -0.20563225408703353}}}},
    {"adamw_clip", R"(adamw(lr=0.01, weight_decay=0.1, no_decay=["b"], grad_clip=0.5))",
     {{{0.48950000063245647, -0.2897000002529826, 0.789200001264913}, {0.09000000042163768, -0.19000000126491293}},
      {{0.4927903309585599, -0.2876365194039893, 0.7790523240403252}, {0.0806313219237051, -0.19377983144435565}},
      {{0.49461554893446386, -0.29050945597728983, 0.7780394545056444}, {0.07792236427335131, -0.1978200581503304}}}},
  };
  // clang-format on
  double worst = 0;
  for (const Scenario& s : scenarios) {
    CAPTURE(s.name);
    ir::Graph g = compile_training(R"yaml(
model: fixed-grads
inputs: {gw: {shape: [3]}, gb: {shape: [2]}}
params:
  w: {shape: [3], init: zeros}
  b: {shape: [2], init: zeros}
loss: sum(w * gw) + sum(b * gb)
optimizer: )yaml" + s.optimizer + "\n");
    Interpreter it(g, Numerics::Float64);
    it.set(interp::initial_values(g, 0));  // state: zeros
    it.set(named(g, "w"), w0);
    it.set(named(g, "b"), b0);
    for (size_t t = 0; t < s.steps.size(); ++t) {
      CAPTURE(t + 1);
      it.set(named(g, "gw"), grads_w[t]);
      it.set(named(g, "gb"), grads_b[t]);
      it.run();
      CHECK(it.get(g.find_output("grad.w")) == grads_w[t]);  // the gradient is exactly the chosen one
      CHECK(it.get(g.find_output("grad.b")) == grads_b[t]);
      it.apply_updates();
      worst = std::max(worst, check_rel(it.get(named(g, "w")), s.steps[t].w, "w"));
      worst = std::max(worst, check_rel(it.get(named(g, "b")), s.steps[t].b, "b"));
    }
  }
  MESSAGE("worst relative error against torch.optim: " << worst);
}

TEST_CASE("optimizer: parameters matched by no_decay do not decay") {
  // One step from the same start: with decay, w moves by lr·wd·w more than
  // without; w_b (no_decay) moves exactly as without decay, for the coupled
  // (sgd, adam) and the decoupled (adamw) rule.
  for (const char* kind : {"sgd", "adam", "adamw"}) {
    CAPTURE(kind);
    auto one_step = [&](const std::string& options) {
      ir::Graph g = compile_training(tiny_model(std::string(kind) + "(lr=0.1" + options + ")", 5));
      Interpreter it(g, Numerics::Float64);
      it.set(interp::initial_values(g, 3));
      it.set(fixed_data(g));
      it.run();
      it.apply_updates();
      return std::make_pair(it.get(named(g, "w")), it.get(named(g, "w_b")));
    };
    auto [w_plain, b_plain] = one_step("");
    auto [w_decay, b_decay] = one_step(", weight_decay=0.5, no_decay=[\"*_b\"]");
    auto [w_all, b_all] = one_step(", weight_decay=0.5");
    CHECK(b_decay == b_plain);  // bit for bit: no decay node touches it
    CHECK(w_decay == w_all);
    CHECK(w_decay != w_plain);
    CHECK(b_all != b_plain);
  }
  // A no_decay pattern that matches no parameter is a mistake, not a no-op
  // (the next test has more).
  std::string out = napkin::testing::compile_errors(tiny_model("adamw(lr=0.1, weight_decay=0.5, no_decay=[\"*.b\", \"W*\"])", 5));
  CHECK(out.find("no_decay pattern '*.b' matches no parameter") != std::string::npos);
  CHECK(out.find("no_decay pattern 'W*' matches no parameter") != std::string::npos);
}

TEST_CASE("optimizer: each no_decay pattern must match a parameter - the hint names the likely one") {
  const std::string model = R"yaml(dims: {d: 4}
inputs: {x: {shape: [2, d]}}
blocks:
  block:
    params: {w: {shape: [d, d], init: normal(0.02)}, ln_g: {shape: [d], init: ones}}
    forward:
      - x: relu(x @ w) * ln_g
forward:
  - y: repeat(block, 2, x)
loss: mean(y)
)yaml";
  ir::Diagnostics ok;
  CHECK(frontend::load_model_text(model + "optimizer: adamw(lr=0.1, no_decay=[\"*ln_g\", 'blocks.?.w'])\n", "m.yaml", ok)
            .has_value());
  CHECK_FALSE(ok.has_errors());
  // A pattern must match the whole name: 'ln_g' alone misses the block prefix.
  std::string out = napkin::testing::compile_errors(model + "optimizer: adamw(lr=0.1, no_decay=[\"*w\", \"ln_g\"])\n");
  CHECK(out.find("inline.yaml:11:42: error: no_decay pattern 'ln_g' matches no parameter; did you mean '*ln_g'? "
                 "(a pattern matches the whole name, block prefixes included)") != std::string::npos);
  CHECK(out.find("the parameters: blocks.0.w, blocks.0.ln_g, blocks.1.w, blocks.1.ln_g") != std::string::npos);
  CHECK(out.find("1 error generated.") != std::string::npos);
  // After an earlier error the parameters may be incomplete: no_decay is not checked then.
  std::string broken = napkin::testing::compile_errors(std::string(model).replace(model.find("repeat(block"), 6, "repeet") +
                                      "optimizer: adamw(lr=0.1, no_decay=[\"*ln_g\"])\n");
  CHECK(broken.find("no_decay") == std::string::npos);
  CHECK(broken.find("1 error generated.") != std::string::npos);
}

TEST_CASE("optimizer: glob_match") {
  using passes::glob_match;
  CHECK(glob_match("*", ""));
  CHECK(glob_match("*", "blocks.3.ln1_g"));
  CHECK(glob_match("", ""));
  CHECK_FALSE(glob_match("", "a"));
  CHECK_FALSE(glob_match("a", ""));
  CHECK(glob_match("wpe", "wpe"));
  CHECK_FALSE(glob_match("wpe", "wpe2"));
  CHECK_FALSE(glob_match("wpe", "xwpe"));
  CHECK(glob_match("*_b", "w_b"));
  CHECK(glob_match("*_b", "blocks.0.attn_b"));  // * crosses dots
  CHECK_FALSE(glob_match("*_b", "w_bias"));
  CHECK(glob_match("ln*", "ln1_g"));
  CHECK_FALSE(glob_match("ln*", "blocks.0.ln1_g"));  // anchored at both ends
  CHECK(glob_match("*ln*", "blocks.0.ln1_g"));
  CHECK(glob_match("blocks.*.ln?_g", "blocks.11.ln2_g"));
  CHECK_FALSE(glob_match("blocks.*.ln?_g", "blocks.11.ln_g"));
  CHECK(glob_match("?", "a"));
  CHECK_FALSE(glob_match("?", ""));
  CHECK_FALSE(glob_match("?", "ab"));
  CHECK(glob_match("a?c", "a.c"));  // ? matches a dot
  CHECK(glob_match("**", "abc"));
  CHECK(glob_match("a**b", "ab"));
  CHECK(glob_match("*?", "x"));
  CHECK_FALSE(glob_match("*?", ""));
  // Backtracking: the first candidate for a star is not the right one.
  CHECK(glob_match("*a*b", "aXbXab"));
  CHECK(glob_match("*a*b", "ab"));
  CHECK_FALSE(glob_match("*a*b", "aXbXa"));
  CHECK(glob_match("*ab", "aab"));
  CHECK(glob_match("*aab", "aaab"));
  CHECK(glob_match("a*b*c", "abbbcbc"));
  CHECK_FALSE(glob_match("a*b*c", "abbbcb"));
  CHECK(glob_match("*.w", "blocks.0.w.w"));
  CHECK_FALSE(glob_match("*.w", "blocks.0.w.b"));
  // Case matters; no character classes.
  CHECK_FALSE(glob_match("W", "w"));
  CHECK_FALSE(glob_match("[ab]", "a"));
  CHECK(glob_match("[ab]", "[ab]"));
  // Many stars against a long non-match stays fast (no exponential backtracking).
  CHECK_FALSE(glob_match("*a*a*a*a*a*a*a*a*a*a*b", std::string(200, 'a')));
}

TEST_CASE("optimizer: AdamW's FLOPs are the formula's operations, counted by hand") {
  // w: 3×2 (decays), w_b: 2 (no_decay); constant lr, no warmup, no clip.
  ir::Graph g = compile_training(tiny_model("adamw(lr=0.01, weight_decay=0.1, no_decay=[\"*_b\"])", 5));
  const double N_w = 6, N_b = 2;
  // Scalars, once: t = step + 1 (the cast to f32 is free); 1 − β₁ᵗ and
  // 1 − β₂ᵗ (pow, sub each); lr / (1 − β₁ᵗ); √(1 − β₂ᵗ).
  const double shared = 1 + 2 + 2 + 1 + 1;
  // Per parameter, per element:
  //   m ← β₁·m + (1 − β₁)·g           3   (mul, mul, add)
  //   v ← β₂·v + (1 − β₂)·g·g         4   (mul, mul, mul, add)
  //   √v / √(1 − β₂ᵗ) + ε             3   (sqrt, div, add)
  //   m / (...)  · step_size,  p − .. 3   (div, mul, sub)
  const double per_element = 3 + 4 + 3 + 3;
  // Decoupled decay of w: p · (1 − lr_t·wd): a scalar mul and sub, then one mul per element.
  const double decay = 2 + N_w;
  analysis::StepCost c = analysis::analyze_step(g, nullptr);
  CHECK(c.phase(ir::Phase::Optimizer).flops == shared + per_element * (N_w + N_b) + decay);
  CHECK(c.phase(ir::Phase::Optimizer).flops == 119);
}
