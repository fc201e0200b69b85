// The reference interpreter: runs a napkin graph on the CPU in double, one op
// at a time, as plainly as possible. It is the numeric oracle that autodiff,
// the optimizer passes and the generated trainers are checked against, not a
// way to train anything big.
//
// Every value is held densely, row-major in its LOGICAL shape; the IR's
// layouts and strides are a storage concern the interpreter ignores (a view's
// elements come from its op's index mapping: permute, reshape = same order,
// broadcast, slice, select).
//
// Numerics:
//   Float64  every floating value stays in double; nothing is rounded. The
//            oracle for autodiff checks (central differences in double).
//   Native   each op computes its result in double from its (already rounded)
//            inputs and rounds it once to its output's dtype (round_to_dtype in
//            interp/rounding.h: f32 by static_cast, bf16/f16/fp8 correctly
//            rounded from the double). A composite op (layernorm, softmax,
//            cross_entropy, ...) is one op: its internals are not rounded.
//   Float64 with rounding noise (perturb_roundings): every floating value an
//            op computes from floating operands moves one ulp up or down, each
//            with probability 1/4 (values set from outside, constants, fills
//            and casts of integers stay as they are). The spread of such runs is
//            how much float64 rounding moves a result: the gradient check's
//            estimate of its finite differences' own error (gradient_check.h).
//   Native with rounding noise (perturb_roundings): as Native, but every
//            floating value that rounding changes is rounded the other way
//            (round_other_way in rounding.h) with probability 1/2: random
//            rounding, as in the CESTAC method. A run of the same graph with
//            another, equally plausible set of rounding errors; values stay
//            values of their dtype, so an op that is exact (a view, a max, a
//            multiplication by 2) stays exact. How far such runs spread is the
//            gradient check's estimate of how much the graph's roundings move
//            a result (gradient_check.h). Only the normal range is randomized:
//            a value that underflows (to a subnormal or zero) or overflows is
//            rounded to nearest in every run, so an error that comes from
//            leaving the range is not part of the noise.
// In both modes integer values are whole numbers held in double (integer
// division truncates toward zero; a float -> int cast truncates, NaN -> 0,
// saturating) and bool is 0/1. Integer overflow is not modelled (values stay
// exact up to 2^53).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "ir/graph.h"
#include "runtime/rng.h"

namespace napkin::interp {

enum class Numerics { Float64, Native };

class Interpreter {
 public:
  // g must outlive the interpreter and not change while it is used.
  Interpreter(const ir::Graph& g, Numerics numerics);

  // Sets an Input, Param or State value (anything else: std::invalid_argument,
  // as is a size other than the value's element count). `data` is dense
  // row-major in the value's logical shape; it is rounded to the value's dtype
  // (Native; integer and bool dtypes in both modes).
  void set(ir::ValueId v, std::vector<double> data);
  // Sets every entry of `values` (the maps initial_values and random_inputs return).
  void set(const std::map<ir::ValueId, std::vector<double>>& values);

  // A value, dense row-major in its logical shape: one that was set, or any
  // value after run(). std::out_of_range if it has none.
  const std::vector<double>& get(ir::ValueId v) const;
  bool has(ir::ValueId v) const;

  // Executes g.schedule() in order. Every Input, Param and State value must be
  // set (std::runtime_error naming the first missing one). Data errors, such as
  // an embedding id outside the table, throw std::runtime_error naming the op.
  void run();

  // For each g.updates entry, target := value (all read before any is
  // written). run() again is then the next step.
  void apply_updates();

  Numerics numerics() const { return numerics_; }

  // From now on every inexactly rounded value (Native: set() or run();
  // Float64: every floating value run() computes) gets rounding noise drawn
  // from runtime::Rng(seed, stream), see the header comment. Same seed and
  // stream, same noise.
  void perturb_roundings(uint64_t seed, uint64_t stream);

 private:
  const ir::Graph& g_;
  Numerics numerics_;
  std::vector<std::vector<double>> values_;
  std::vector<char> has_;
  std::optional<runtime::Rng> noise_;  // set by perturb_roundings
  // computed: an op's result (or an update), not a value set from outside.
  void store(ir::ValueId v, std::vector<double> data, bool computed);
};

// Parameter initial values from each Param's InitSpec: zeros, ones,
// constant(value), normal(std), trunc_normal(std, lo, hi) and xavier (a
// truncated normal with the spec's std, lo, hi), mean 0. Each parameter draws
// from runtime::Rng(seed, runtime::stream_for_name(its name)) in row-major
// order, so its values depend only on (seed, name). State values (optimizer
// state) are zeros. The values are the exact double samples; Interpreter::set
// rounds them to the dtype in Native mode, as a trainer's f32 init would.
std::map<ir::ValueId, std::vector<double>> initial_values(const ir::Graph& g, uint64_t seed);

// Random values for every graph input, for checks: floating inputs ~ N(0, 1);
// integer inputs uniform in [0, n), n the tightest bound among their uses: an
// embedding's ids -> rows of the table (dims[0] of input 0); cross_entropy and
// cross_entropy_grad targets -> classes (the logits' last dim); an
// embedding_grad's ids -> its attr vocab. Uses are followed through views and
// data movement of the input (reshape, permute, slice, select, broadcast,
// copy, concat, pad) and casts to an integer dtype. An integer input with no bounding use gets n = 2
// (0 or 1); bool inputs are 0/1. Input v draws from
// runtime::Rng(seed, stream_for_name(its name)). The rng tensor (ir/rng.h), if
// the graph has one, gets the words of a training step 0 under `seed`
// (runtime::rng_tensor_words), so random ops are fixed functions of their inputs.
std::map<ir::ValueId, std::vector<double>> random_inputs(const ir::Graph& g, uint64_t seed);

}  // namespace napkin::interp
