// The mixed-precision pass: rewrites the forward graph, before autodiff, so
// that contractions compute in a low-precision dtype while the ops that need
// range or many-term sums stay in f32. Autodiff then differentiates through
// the inserted casts (the VJP of a cast is the cast back), which gives the
// backward its casts: parameter gradients arrive in f32, the backward of a
// low-precision contraction runs in the low dtype.
//
// Terms:
//  - policy: g.config.precision.policy. fp32 leaves the graph untouched.
//  - L, the low dtype: bf16 for bf16-mixed and fp8-mixed (fp8 quantizes the
//    bf16 contraction operands after autodiff, passes/fp8_scaling.h), f16 for
//    fp16-mixed.
//  - floating operand: an input whose dtype is floating; integer and bool
//    operands (ids, targets, conditions) are never cast.
//  - width order: f8 < bf16 = f16 < f32 < f64 (bytes per element); the
//    widest of a set of dtypes is the one of most bytes, f32 when the widest
//    are two different 16-bit formats (torch: bf16 + f16 -> f32).
//  - selected node: a forward node matched by a pattern of precision.fp32 (a
//    glob: `*` any run of characters, `?` one). A pattern selects a node when
//    it matches the node's block scope or a dot-prefix of it ("blocks.0",
//    "blocks.*"), or the name of a value defined by a node of the same forward
//    entry: the same YAML line in the same block instance ("logits",
//    "blocks.1.h" select every op written on that line). A pattern that selects
//    nothing is an error at the pattern.
//  - the rule of a forward node, the first that applies (AmpRule; an op's
//    own rule is its op table row's PrecisionRule, ir/op.h):
//      as written   constant, arange and the user's own casts: unchanged.
//      fp32 override  a selected node, views excepted (a view keeps its
//                   input's dtype: it computes nothing): floating operands cast to f32.
//      contraction  matmul, einsum: floating operands cast to L, the result
//                   is L; the sum of products accumulates in f32 (the CPU GEMM
//                   and the interpreter accumulate wide; the audit says so).
//      fp32 op      rule Fp32 (exp, log, softmax, norms, reductions, losses;
//                   docs/mixed-precision.md lists them): floating operands
//                   cast to f32 (range, or sums of many terms).
//      follows inputs  every other op (elementwise, views, copies, concat,
//                   pad, embedding, where, comparisons): computes in the
//                   widest dtype of its floating operands of rank > 0 (of all
//                   of them when all are scalars); narrower ones are cast up
//                   (torch type promotion). A scalar operand does not promote
//                   a tensor (torch's 0-dim rule): a constant is remade in the
//                   result dtype, any other scalar is cast to it.
//  - inserted cast: a cast node the pass adds; its attr `amp` says why:
//      "param low-precision copy"  a parameter (or a view of one) cast to L,
//                                  once per step, shared by all its users;
//      "matmul input"              an activation cast to L for a contraction;
//      "fp32 op input"             a low value cast up for an fp32 op or override;
//      "promotion"                 a narrower operand cast up for "follows inputs";
//      "scalar operand"            a non-constant scalar cast to the result dtype.
//    A value is cast to a dtype at most once; later users share the cast.
//  - parameters stay f32 (master weights), so the optimizer and its state stay
//    f32. Names, YAML locations and scopes of the rewritten nodes are kept;
//    inserted nodes take their first user's location and scope.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "passes/pass.h"

namespace napkin::passes {

std::unique_ptr<Pass> make_mixed_precision_pass();

enum class AmpRule : uint8_t { AsWritten, Fp32Override, Contraction, Fp32Op, FollowsInputs };
// "as written", "fp32 override", "contraction", "fp32 op", "follows inputs".
std::string_view amp_rule_name(AmpRule r);

// The rule of a forward node (see above); `selected`: a precision.fp32 pattern selects it.
AmpRule amp_rule(ir::Op op, bool selected);

// Which forward nodes the precision.fp32 patterns select, indexed by node id.
// Each pattern that selects no node is reported to `diag` (when given) at the pattern.
std::vector<bool> select_fp32_overrides(const ir::Graph& g, ir::Diagnostics* diag);

// The attr a cast inserted by the pass carries: the reason, as listed above.
inline constexpr const char* kAmpCastAttr = "amp";

}  // namespace napkin::passes
