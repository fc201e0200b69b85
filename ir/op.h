// The Op enum (from ops.def), op classes, the op table row; an op node's attributes are ir/attrs.h's.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ir/attrs.h"
#include "ir/loop.h"
#include "ir/type.h"

namespace napkin::ir {

enum class Op : uint16_t {
#define OP(Enum, name, arity, cls) Enum,
#include "ir/ops.def"
#undef OP
};

inline constexpr int kNumOps = 0
#define OP(Enum, name, arity, cls) +1
#include "ir/ops.def"
#undef OP
    ;

// What kind of work an op does: passes decide by class (fusion groups
// elementwise chains; views cost nothing; contractions go to BLAS).
enum class OpClass : uint8_t {
  Source,         // makes a value from attributes
  Elementwise,    // out[i] depends on in[i] (after broadcasting) and maybe i itself
  Reduction,      // folds axes
  Contraction,    // matmul / einsum: 2 FLOPs per multiply-add
  View,           // new strides over the same buffer
  Copy,           // moves data without arithmetic
  Gather,         // indexed reads (embedding)
  Normalization,  // softmax, layernorm: a reduction and elementwise work along one axis
  Loss,           // reduces to a scalar loss
  Attention,      // softmax(scale q kᵀ) v as one kernel that stores no scores (ir/loop.h)
  Classifier,     // cross_entropy(x wᵀ, targets) in vocabulary chunks: no logits stored (ir/loop.h)
  Rotary,         // rope: pairs of elements along one axis turned by their position's angles (ir/rope.h)
  Routing,        // top_k, moe_slots: which rows go where (mixture of experts), integer results (ir/loop.h)
  Collective,     // what the ranks of a job compute together (all_reduce_sum, all_gather, reduce_scatter: ir/loop.h)
};
std::string_view op_class_name(OpClass c);


class Graph;
struct Node;

// Result of a shape/dtype rule: output types or a user-facing error.
struct InferResult {
  std::vector<TensorType> outputs;
  std::string error;  // empty on success
  std::string hint;
  int blame = -1;  // the input at fault when one is: the frontend points its caret there
  bool ok() const { return error.empty(); }
  InferResult& blaming(int input) {
    blame = input;
    return *this;
  }
  static InferResult fail(std::string error, std::string hint = "") {
    InferResult r;
    r.error = std::move(error);
    r.hint = std::move(hint);
    return r;
  }
  static InferResult of(TensorType t) {
    InferResult r;
    r.outputs.push_back(std::move(t));
    return r;
  }
};

// The cost of one node: FLOPs and bytes of memory traffic, under the
// conventions in docs/report.md (a multiply-add is 2 FLOPs; a view is free;
// an input is read once even if broadcast).
struct OpCost {
  double flops = 0;
  double bytes_read = 0;
  double bytes_written = 0;
  // FLOPs the node spends recomputing what its forward already computed
  // (fused attention's backward recomputes the scores), apart from `flops`:
  // the kernel runs them, model FLOPs (MFU) do not count them.
  double recompute_flops = 0;
  // The part of `flops` in matrix products between activations when an op
  // does them inside (fused attention's q·kᵀ and p·v): the report's activation
  // matmul FLOPs, the rest of `flops` being its other work.
  double activation_matmul_flops = 0;
  // The same for products with a parameter done inside an op (the fused
  // classifier's x·wᵀ and its gradients): the report's weight-matmul FLOPs.
  double param_matmul_flops = 0;
};

class Builder;

using InferFn = InferResult (*)(const std::vector<const TensorType*>& inputs, const Attrs& attrs);
using CostFn = OpCost (*)(const Graph& g, const Node& n);
// The vector-Jacobian product: given dy, the gradient of the loss with respect
// to the node's output, builds the gradients with respect to its inputs (one
// entry per input, each of that input's type; kNoValue where an input gets none:
// integer ids, masks, conditions). `n` is a copy: the rule adds nodes, which may
// move the graph's node storage. The rules live in ir/vjp.cpp.
using VjpFn = std::vector<ValueId> (*)(Builder& b, const Node& n, ValueId dy);

// How the mixed-precision pass (passes/mixed_precision.h) computes the op
// under a mixed policy, unless a precision.fp32 pattern selects the node.
enum class PrecisionRule : uint8_t {
  AsWritten,      // in the dtype the model wrote: constants, arange, the user's own casts
  Contraction,    // floating operands in the low dtype, accumulated in f32: matmul, einsum
  Fp32,           // floating operands in f32: ops that need range or sum many terms
  FollowsInputs,  // in the widest dtype of its floating operands (views keep their input's)
};

// Whether the op table makes the op a function a model calls by the op's
// name. Others may still have a function written by hand in
// frontend/calls.cpp (gelu takes approximate=, cast a dtype, sum lowers to
// reduce_sum).
enum class UserFunction : uint8_t {
  None,
  Unary,          // f(x); a number folds through the op's formula (ir/elementwise_formulas.h)
  UnaryIntegral,  // the same, and a folded integer stays an integer (neg, abs, relu)
};

// One row of the op table. Later passes add their rules here (backend lowering).
// An elementwise op's math is not a column: it is ir/elementwise_formulas.h's.
struct OpInfo {
  Op op;
  std::string_view name;
  int arity;  // -1: variadic
  OpClass op_class;
  LoopKind loop;  // the loop it runs as (ir/loop.h)
  InferFn infer;
  CostFn cost;
  double flops_per_element;  // elementwise/normalization convention; documented in docs/report.md
  VjpFn vjp = nullptr;       // nullptr: not differentiable (backward-only ops); see ir/vjp.h
  // exp, log, tanh, erf, sin, cos or pow evaluations per element: a library
  // call, far dearer than the FLOPs it is counted as (the time model, analysis/step_time.h)
  double transcendentals_per_element = 0;
  PrecisionRule precision = PrecisionRule::FollowsInputs;
  UserFunction user_function = UserFunction::None;
  // Emitted by a pass only (autodiff's softmax_grad, ..., the optimizer's
  // all_reduce_sum): has no VJP (napkin differentiates once) and never
  // meets the mixed-precision pass.
  bool backward_only = false;
  ElementIndex element_index = ElementIndex::None;  // an Elementwise op's (ir/loop.h)
};

const OpInfo& op_info(Op op);

// The one place that reads an op and its attributes into its loop's parameters.
LoopParams loop_params(Op op, const Attrs& attrs);

// Transcendental function evaluations of node `n`: its row's count per
// element times its elements (an input row's for normalization and loss ops).
double transcendentals(const Graph& g, const Node& n);

// Bytes of the distinct elements value `v` reads from its buffer: a broadcast
// (stride-0) axis is read once, not once per repetition. The cost rules'
// convention, for every later stage that counts bytes (fusion, the time model).
double distinct_bytes(const Graph& g, ValueId v);

// A contraction node (matmul, einsum) as one batched GEMM:
// C[batch, m, n] = sum_k A[batch, m, k] B[batch, k, n], each a product of
// axes. A batch axis only one operand has folds into its m (or n), as a GEMM
// library runs it (x[b, t, d] @ w[d, e] is one GEMM with m = b·t).
struct ContractionDims {
  double batch = 1, m = 1, n = 1, k = 1;
  double narrowest() const;  // min(m, n, k)
};
ContractionDims contraction_dims(const Graph& g, const Node& n);

// An attention or attention_grad node's dims (ir/loop.h) and the (query, key)
// pairs its scores cover per (batch, head): T·S, or under causal the pairs
// j <= i + S - T, T(S - T + 1) + T(T - 1)/2 (T(T + 1)/2 at T == S).
struct AttentionDims {
  double batch = 1, heads = 1, kv_heads = 1, q_len = 1, kv_len = 1, head_dim = 1, pairs = 0;
  bool causal = false;
};
AttentionDims attention_dims(const Graph& g, const Node& n);

// A linear_cross_entropy(_grad) node's dims: rows (the product of x's leading
// axes), vocab and d (the contracted axis).
struct ClassifierDims {
  double rows = 1, vocab = 1, d = 1;
};
ClassifierDims classifier_dims(const Graph& g, const Node& n);
// The dtype of the fused classifier's loss and lse for x of dtype `x`: f64
// for f64, else f32 (the softmax runs in f32 whatever the operands).
DType classifier_loss_dtype(DType x);
std::string_view op_name(Op op);
std::optional<Op> find_op(std::string_view name);

}  // namespace napkin::ir
