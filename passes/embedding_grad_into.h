// A tied embedding's gradient summed where the embedding's is scattered: the
// table is read twice (a lookup and a classifier, GPT-2's wte), so its
// gradient is the sum of the classifier's dense gradient and the lookup's
// scatter,
//
//   s = add(g, embedding_grad(dy, ids))   ->   s = embedding_grad(dy, ids, g)
//
// and the scatter kernel adds dy's rows into g's buffer in place (the memory
// plan hands it over: analysis/in_place_reuse.h) instead of zeroing a
// [vocab, d] table and adding it to g in a kernel of its own (GPT-2 124M:
// 0.3 GiB a step, the table written and read twice less; one kernel less in
// fp32, where no widening cast is left to run).
// When the scatter's result is read only by the add, g is a value of the
// same type read only by the add (so it is dead after it: in place), not a
// view, and made by the backward. The scatter moves to the add's position,
// and a widening cast that makes g to right before it (the narrower value
// stays alive in between, not g).
// Runs after autodiff and the cast passes, before fusion.
#pragma once

#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

std::unique_ptr<Pass> make_embedding_grad_into_pass();

}  // namespace napkin::passes
