// The interpreter's op kernels (internal): each computes one node's output in
// double, densely in its logical shape, from its inputs' dense values. They know
// nothing of Numerics: the driver rounds what they return (Native) or keeps it
// (Float64). Integer semantics (cast truncation, integer division) live here
// and in the elementwise arithmetic (float64_arithmetic.h) because they are
// the dtype's meaning, not a rounding.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "interp/node_error.h"
#include "interp/shape.h"
#include "ir/graph.h"
#include "ir/rope.h"
#include "runtime/rope.h"

namespace napkin::interp::detail {

struct Arg {
  Shape shape;
  ir::DType dtype;
  const std::vector<double>& data;
};

struct OutType {
  Shape shape;
  ir::DType dtype;
};

using Data = std::vector<double>;

// The outputs of node n, one per output type. Throws std::runtime_error for a
// data-dependent error (an id out of range, an integer division by zero), naming the op.
// `native`: the values an op's definition rounds inside (the fused
// classifier's logits and their gradient, ir/loop.h) are rounded to their
// dtype; false (Float64 numerics) keeps them exact, as every stored value.
std::vector<Data> eval_node(const ir::Node& n, const std::vector<Arg>& in, const std::vector<OutType>& outs,
                            bool native = true);

// Normalization, losses and their backward rules (nn_kernels.cpp).
Data softmax(const Arg& x, int64_t axis, bool log);
Data softmax_grad(const Arg& y, const Arg& dy, int64_t axis);
Data layernorm(const Arg& x, const Arg& gain, const Arg& bias, double eps);
Data rmsnorm(const Arg& x, const Arg& gain, double eps);
Data layernorm_grad(const Arg& x, const Arg& gain, const Arg& dy, double eps);
Data rmsnorm_grad(const Arg& x, const Arg& gain, const Arg& dy, double eps);
Data norm_gain_grad(const Arg& x, const Arg& dy, double eps, bool centered);
Data cross_entropy(const ir::Node& n, const Arg& logits, const Arg& targets);
Data cross_entropy_grad(const ir::Node& n, const Arg& logits, const Arg& targets, const Arg& dloss);
Data mse(const Arg& a, const Arg& b);
Data embedding(const ir::Node& n, const Arg& table, const Arg& ids);
// Into `base` (the same shape as the result) where given, else into zeros.
Data embedding_grad(const ir::Node& n, const Arg& dy, const Arg& ids, int64_t vocab, const Arg* base = nullptr);
// Fused attention by its definition (ir/loop.h), every score of a row at
// once: (q, k, v) -> {o, lse}; (q, k, v, o, lse, do) -> {dq, dk, dv}.
std::vector<Data> attention(const ir::AttentionParams& p, const std::vector<Arg>& in);
std::vector<Data> attention_grad(const ir::AttentionParams& p, const std::vector<Arg>& in);
// cached_attention by its definition (ir/loop.h): (q, k, v, k_cache, v_cache,
// positions) -> {o, the key cache, the value cache}, the caches with the new
// rows written (the interpreter stores them back into its inputs 3 and 4).
std::vector<Data> cached_attention(const ir::Node& n, const ir::CachedAttentionParams& p, const std::vector<Arg>& in);
// rope by its definition (ir/rope.h): x rotated along p.axis by the angles of
// each index of p.seq_axis, or of positions[index] when given.
Data rope(const ir::RopeParams& p, const Arg& x, const Arg* positions);
// The runtime's description of the rotation p makes of rows of `dim` elements.
runtime::RopeDesc rope_desc(const ir::RopeParams& p, int64_t dim);
// top_k by its definition (ir/loop.h TopKParams): {values, indices}.
std::vector<Data> top_k(const ir::TopKParams& p, const Arg& x);
// moe_slots by its definition (ir/loop.h MoeSlotsParams): {pos, src, counts};
// throws for an index outside [0, experts).
std::vector<Data> moe_slots(const ir::Node& n, const ir::MoeSlotsParams& p, const Arg& indices);
// The fused classifier by its definition (ir/loop.h), every logit of a row at
// once: (x, w, targets) -> {loss, lse}; (x, w, targets, lse, dloss) -> {dx, dw}.
// `native` rounds the logits and their gradient to x's dtype.
std::vector<Data> linear_cross_entropy(const ir::Node& n, const std::vector<Arg>& in, bool native);
std::vector<Data> linear_cross_entropy_grad(const ir::Node& n, const std::vector<Arg>& in, bool native);

}  // namespace napkin::interp::detail
