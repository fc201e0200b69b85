// The op's loop kind: the shape of the loop an op runs as, a column of its op
// table row (OpInfo::loop), with the loop's parameters (ir/op.h
// loop_params). The interpreter evaluates a node by it; the step's kernels turn
// it into each kernel's KernelKind (analysis/step_kernels.h), which may differ: a fused group of
// elementwise ops is one kernel, a contraction runs as a GEMM or as loops.
// An op's own arithmetic (the elementwise formulas, the row formulas) stays
// with the kind's emitter; the loop kind only says which emitter it is.
#pragma once

#include <cstdint>
#include <optional>
#include <variant>
#include <vector>

namespace napkin::ir {

enum class LoopKind : uint8_t {
  View,         // no loop: new strides over the input's buffer
  Fill,         // writes values made from attributes (FillParams)
  Elementwise,  // out[i] from in[i] (broadcast) and maybe i's position (ElementIndex)
  Reduction,    // folds axes with a combiner (ReductionParams)
  Contraction,  // sums products over shared axes (ContractionParams)
  Concat,       // places inputs side by side along an axis, or one between zeros (ConcatParams)
  Gather,       // rows of a table picked by ids (embedding)
  ScatterAdd,   // rows added into a table at ids (the embedding gradient)
  Rows,         // a reduction and elementwise work along one axis, per row (RowParams)
  Mse,          // the mean of squared differences: one scalar
  Attention,    // softmax(scale * q kᵀ, causally masked) v, tile by tile, no T×T value (AttentionParams)
  Classifier,   // cross_entropy(x wᵀ, targets) over vocabulary chunks, no rows×V value (ClassifierParams)
  CachedAttention,  // attention of new rows against a KV cache they are first written into (CachedAttentionParams)
  Rope,         // pairs along one axis rotated by their position's angles (ir/rope.h RopeParams)
  Collective,   // what the ranks of a job compute together (CollectiveParams): here, a copy; the runtime does the rest
  TopK,         // the k largest of each row along the last axis and their indices (TopKParams)
  MoeSlots,     // each token's expert choices placed in the experts' slots, choice-major, past capacity dropped (MoeSlotsParams)
};

// What an elementwise op reads of its element's position besides its
// operands (a column of the op table row): nothing, its (row, column) in the
// last two dims (triu, causal_mask), or its row-major index in the output
// (dropout: the index keys the element's random draw).
enum class ElementIndex : uint8_t { None, RowCol, Flat };

enum class FillPattern : uint8_t { Constant, Arange };
struct FillParams {
  FillPattern pattern = FillPattern::Constant;
  double value = 0;  // Constant's
};

enum class Combiner : uint8_t { Sum, Max, Min };
struct ReductionParams {
  Combiner combiner = Combiner::Sum;
  bool mean = false;  // divides each sum by the count of elements folded into it
  std::vector<int64_t> axes;
  bool keepdims = false;
};

// einsum's axis ids per operand; matmul has none: (..., m, k) @ (..., k, n)
// -> (..., m, n) with the batch dims broadcast.
struct ContractionParams {
  bool einsum = false;
  std::vector<int64_t> lhs, rhs, out;
};

struct ConcatParams {
  int64_t axis = 0;
  std::optional<int64_t> pad_before;  // pad: the one input placed here along the axis, zeros elsewhere
};

// The row kernels. Operands (codegen/plan.h's row_loop gives their shapes):
//   Softmax, LogSoftmax      (x) -> y
//   SoftmaxGrad              (y, dy) -> dx = y * (dy - sum(dy * y))
//   CrossEntropy             (logits, targets per row) -> the mean over rows of -log softmax[target]
//   CrossEntropyGrad         (logits, targets, dloss) -> (softmax - onehot) * dloss / rows
//   Norm                     (x, gain, bias if centered) -> x_hat * gain (+ bias)
//   NormGrad                 (x, gain, dy) -> dx; with `gains` also the gain's gradient
//                            (sum over rows of dy * x_hat) and, centered, the bias's (sum of dy)
// x_hat = (x - mean) * rstd, mean = 0 unless centered (layernorm; rmsnorm is
// not), rstd = 1 / sqrt(mean((x - mean)^2) + eps).
enum class RowVariant : uint8_t { Softmax, LogSoftmax, SoftmaxGrad, CrossEntropy, CrossEntropyGrad, Norm, NormGrad };
struct RowParams {
  RowVariant variant = RowVariant::Softmax;
  int64_t axis = -1;  // the row's axis in input 0 (negative counts from the end)
  bool centered = false;
  double eps = 0;
  bool gains = false;  // NormGrad: the gains' gradients too
};

// Rotary position embeddings (the rope op; its attributes: ir/rope.h, its
// arithmetic: runtime/rope.h). Also what an attention that rotates its q and
// k as it loads them applies (under the attributes' prefix "rope_").
enum class RopeStyle : uint8_t { Half, Interleaved };  // runtime/rope.h says how each pairs elements

struct RopeParams {
  RopeStyle style = RopeStyle::Half;
  double theta = 10000;
  // Llama 3.1's frequency scaling; factor 0: none.
  double factor = 0, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_context = 8192;
  // The rope op's own: the rotated axis and the axis whose index is the
  // position (both non-negative), whether a positions operand gives the
  // positions instead, and whether it rotates by the negated angles (the VJP).
  int64_t axis = 0, seq_axis = 0;
  bool explicit_positions = false;
  bool inverse = false;
  bool operator==(const RopeParams&) const = default;
};

// Fused attention (FlashAttention-2's algorithm). Shapes: q [B, Hq, T, D],
// k and v [B, Hk, S, D] with Hq a multiple of Hk (query head h reads kv head
// h / (Hq / Hk)); every operand is contiguous along D.
//   forward   (q, k, v) -> (o [B, Hq, T, D] in q's dtype, lse [B, Hq, T] f32)
//   backward  (q, k, v, o, lse, do) -> (dq, dk, dv), each in its input's dtype
// With s_ij = scale * q_i · k_j over the visible keys j (all S, or under
// `causal` j <= i + S - T: the mask aligned to the bottom right, so T == S is
// the usual lower triangle; causal needs T <= S):
//   lse_i = log sum_j exp(s_ij)   p_ij = exp(s_ij - lse_i)   o_i = sum_j p_ij v_j
//   D_i = do_i · o_i   ds_ij = p_ij (do_i · v_j - D_i)
//   dq_i = scale sum_j ds_ij k_j   dk_j = scale sum_i ds_ij q_i   dv_j = sum_i p_ij do_i
// (dk, dv: also summed over the query heads that share the kv head, in head order).
// Arithmetic in f32 (f64 for f64 operands); no value of B·Hq·T·S elements is stored.
// `seq_major_out` (forward, attr of that name): o is stored [B, T, Hq, D],
// the layout its reader wants when it merges the heads ("b h s hd -> b s (h
// hd)"), instead of [B, Hq, T, D] (passes/attention_layout.h; the backends
// address it through codegen/plan.h attention_output).
// `packed_grad` (backward, attr of that name, heads == kv_heads): dq, dk and
// dv are one value [B, T, 3, Hq, D], the layout of the gradient of a fused
// qkv split by "b s (three h hd) -> three b h s hd", where a concat put them
// (the backends address them through codegen/plan.h attention_gradients).
// `rope` (attrs "rope_*", ir/rope.h; passes/fuse_rope.h sets them): q and k
// are rotary-embedded as they are loaded, query row i at position i + S - T
// and key row j at position j, over D (runtime/rope.h's arithmetic), so s_ij
// above reads rope(q)_i · rope(k)_j; the backward's dq and dk are the
// gradients of the unrotated q and k (the rotated ones' gradients rotated
// back by the negated angles). Only style, theta and the frequency scaling
// of RopeParams apply (its axis, seq_axis, explicit_positions and inverse
// are the rope op's own).
struct AttentionParams {
  bool backward = false;
  bool causal = true;
  double scale = 1;
  bool seq_major_out = false;
  bool packed_grad = false;
  std::optional<RopeParams> rope;
};

// The fused classifier: a linear layer and the cross-entropy loss over its
// outputs as one kernel that never stores the [rows, V] logits (the idea of
// fused linear cross-entropy kernels). Shapes: x [..., d] (rows = the product
// of the leading axes, contiguous along d), w [V, d] (any 2-D strides),
// targets [...] integer class ids in [0, V).
//   forward   (x, w, targets) -> (loss [], lse [...])
//   backward  (x, w, targets, lse, dloss) -> (dx in x's dtype, dw in w's)
// loss and lse are f32 (f64 for f64 operands). With
//   l_rv = round(x_r · w_v)   (rounded to x's dtype, as the matmul it
//                              replaces stores its logits; exact for f32/f64)
//   lse_r = log sum_v exp(l_rv)          loss = mean_r (lse_r - l_r,t_r)
//   g_rv = round((exp(l_rv - lse_r) - [v == t_r]) * dloss / rows)
//                             (rounded to x's dtype, as the cast before the
//                              backward matmuls does)
//   dx_r = sum_v g_rv w_v     dw_v = sum_r g_rv x_r   (f32 sums, rounded once)
// The kernels walk the vocabulary in chunks: the forward keeps a running max
// and sum per row (lse online); the backward recomputes a chunk's logits from
// x, w and lse, and adds that chunk's share to dx and writes its rows of dw.
// A chunk's logits live in a workspace the size of rows x chunk that the
// backends size to stay in cache; the memory plan and the report count no
// logits (docs/report.md, "Classifier").
struct ClassifierParams {
  bool backward = false;
};

// Attention against a key/value cache (inference: passes/derive_inference.h).
// Shapes: q [B, Hq, n, D], k and v [B, Hk, n, D] (the n new rows), k_cache and
// v_cache [B, Hk, S, D] (State values that persist between calls), positions
// [n] integers in [0, S):
//   first   k_cache[b, h, positions[i]] = k[b, h, i], the same for v
//   then    o_i = sum_{j <= positions[i]} p_ij v_cache_j with
//           p_ij = softmax_j(scale * q_i · k_cache_j) over j <= positions[i]
// (query head h reads kv head h / (Hq / Hk)). The only op that writes an
// input: the caches are State that nothing else reads, so the write is seen
// by this op's later calls only. Arithmetic in f32 (f64 for f64 operands).
// `rope` (attrs "rope_*", as AttentionParams'): q_i and k_i are rotated at
// positions[i] first, so the caches hold rotated keys.
struct CachedAttentionParams {
  double scale = 1;
  std::optional<RopeParams> rope;
};

// The parameters of an op's loop kind; monostate for kinds that have none.
// A collective (docs/distributed.md): in one process each is a copy of its
// operand; in a job the runtime makes it
//  - AllReduceSum: the sum over the ranks of each rank's value (ZeRO-2's
//    parts of the clipping norm and of fp16's overflow probe);
//  - AllGather: a parameter's value from its owner, on every rank (ZeRO-3);
//  - ReduceScatter: the sum over the ranks of each rank's gradient of a
//    parameter, kept by the parameter's owner (ZeRO-3).
enum class Collective : uint8_t { AllReduceSum, AllGather, ReduceScatter };
std::string_view collective_name(Collective c);  // "all_reduce_sum", ...
struct CollectiveParams {
  Collective which = Collective::AllReduceSum;
  bool operator==(const CollectiveParams&) const = default;
};

// top_k (attr k): x [..., n] floating -> (values [..., k] in x's dtype,
// indices i32 [..., k]) along the last axis: each row's k largest values in
// descending order, ties to the lower index (a NaN counts as larger than any
// number, so a row with one puts it first, as torch.topk does). Its VJP
// scatters dvalues back at the indices (ir/vjp.cpp); the indices get none.
struct TopKParams {
  int64_t k = 1;
  bool operator==(const TopKParams&) const = default;
};

// moe_slots (attrs experts E, capacity C): the slots of a mixture of
// experts' dispatch buffer [E, C, ...] that its T tokens' k expert choices
// fill (GShard's and Switch's capacity rule). indices i32 [T, k] (token t's
// j-th choice, in [0, E)) ->
//   pos    i32 [T, k]: e * C + slot, or -1 where the assignment was dropped
//   src    i32 [E, C]: the token filling slot (e, c), or 0 for an empty slot
//                      (whose expert row is computed and never read)
//   counts f32 [E]:    assignments to e over all (t, j), before capacity
// Slots fill choice-major (every token's first choice before any token's
// second), then in token order; an assignment to an expert whose C slots are
// full is dropped. An index outside [0, E) is a runtime error (as
// embedding's bad id). Integer results and counts of them: no gradient.
struct MoeSlotsParams {
  int64_t experts = 1, capacity = 1;
  bool operator==(const MoeSlotsParams&) const = default;
};

using LoopParams = std::variant<std::monostate, FillParams, ReductionParams, ContractionParams, ConcatParams, RowParams,
                                AttentionParams, ClassifierParams, CachedAttentionParams, RopeParams, CollectiveParams,
                                TopKParams, MoeSlotsParams>;

}  // namespace napkin::ir
