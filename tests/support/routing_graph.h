// A training graph that routes tokens to experts with top_k and moe_slots,
// built op by op (moe_slots is no function a model calls; the frontend's
// moe() builds the same pattern): the numeric tests run its kernels on the
// CPU and on the emulated GPU against the interpreter.
//
//   logits [T, E] = x [T, d] @ router^T          (router [E, d])
//   values, idx   = top_k(logits, k)
//   pos, src, counts = moe_slots(idx, E, C)      (C * E < T * k: some drop)
//   ye [E, C, f]  = einsum("e c d, e f d -> e c f", embedding(x, src), w)   (w [E, f, d])
//   y [T, f]      = sum over k of embedding(ye as [E*C, f], max(pos, 0)) * where(pos >= 0, values, 0)
//   loss          = sum(y * y) + sum(cast(counts) * sum(logits over tokens))
//
// Its backward runs top_k's VJP (i32 arange, mul and add, embedding_grad)
// and the embeddings' scatter-adds; counts is data (no gradient).
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace napkin::testing {

struct RoutingDims {
  int64_t tokens = 12, d = 6, experts = 4, k = 2, capacity = 5, f = 5;
};

// The graph through the training pipeline: x and the params of `dtype`
// under precision `policy` (top_k then sees logits of dtype, or of the
// policy's low dtype). REQUIREs that it compiles.
ir::Graph routing_training_graph(ir::DType dtype, ir::PrecisionPolicy policy, const RoutingDims& dims = {});

}  // namespace napkin::testing
