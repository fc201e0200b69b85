// Randomness in the graph: the rng tensor and dropout's definition, which the
// reference interpreter, the CPU backend and the CUDA backend each implement
// with the same integer operations (docs/model-language.md, dropout;
// docs/runtime.md, the rng tensor).
//
// Terms:
//  - rng tensor: Graph::rng, an i64[kNumRngWords] that the runtime writes
//    before every forward: the run's seed as two 32-bit words, the step (the
//    0-based index of the training step, the one the data loader gets) and
//    whether the forward trains (1) or evaluates (0). Ops read its words as
//    scalar views (Graph::rng_words), so a random op is an ordinary
//    elementwise op whose operands include those scalars.
//  - dropout(x, seed_lo, seed_hi, step, training) {p, stream}: element i of
//    x (row-major in x's shape) is kept iff
//        philox4x32_10({i, stream, step & 0xffffffff, step >> 32},
//                      {seed_lo, seed_hi})[0] >= dropout_threshold(p)
//    (runtime/rng.h's Philox; word 0 of the block). Training: a kept element
//    is x[i] * dropout_scale(p, dtype), a dropped one 0. Evaluating: x[i].
//    `stream` tells the dropouts of a model apart (the frontend gives each
//    its own); the mask is a pure function of (seed, step, stream, i), so the
//    backward rule (the same dropout applied to dy), a recomputation under
//    --memory-budget and a resumed run all see the same mask, and nothing
//    stores it.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/builder.h"

namespace napkin::ir {

// The words of the rng tensor, in order.
enum RngWord : int64_t { kRngSeedLow, kRngSeedHigh, kRngStep, kRngTraining, kNumRngWords };

// The graph's rng tensor as kNumRngWords scalar i64 views, in RngWord order;
// the first call makes the tensor and the views (at the builder's location).
std::vector<ValueId> rng_words(Builder& b);

// Dropout drops element i when its Philox word is below this: floor(p * 2^32),
// so an element is kept with probability 1 - threshold / 2^32 (1 - p within
// 2^-32). Needs 0 <= p < 1.
uint32_t dropout_threshold(double p);
// What a kept element is multiplied by: 1 / (1 - p) in the compute type of
// dtype t (double for f64, float for the other floats), as a double.
double dropout_scale(double p, DType t);

// The largest tensor dropout takes: an element's index is one 32-bit word of
// the Philox counter.
inline constexpr int64_t kDropoutMaxElements = int64_t{1} << 32;

}  // namespace napkin::ir
