// The kernel plan: a training step as a backend sees it. Backend-neutral: the
// CPU backend (codegen/cpu) turns each loop kernel into an LLVM function, the
// CUDA backend into a CUDA C kernel; both hand contractions to a GEMM library.
//
// Terms:
//  - operand: where a kernel reads or writes one tensor: a byte offset into
//    the arena (analysis/memory_plan.h) plus sizes and element strides, so a view
//    (transpose, broadcast, slice) is read in place, never copied.
//  - kernel: one of the step's kernels (analysis/step_kernels.h: a non-view
//    node, a fusion group or a batch of groups), in their order, with the
//    kind and name listed there. Its kind (KernelKind) says which emitter
//    makes it: a Gemm kernel is a contraction the GEMM library runs
//    (analysis/contraction.h); every other kind is a loop kernel, generated
//    code. Backends and the interpreter switch on the kind (the interpreter
//    on its op's ir::LoopKind) and read the kind's parameters, never the op.
//  - fused loop kernel: a FusedElementwise kernel (`fused` set), or a Gemm
//    with an epilogue (`fused` and `epilogue` set). It loops
//    over the group's iteration shape; per element it loads the group inputs
//    (each read by its own strides, broadcast to the iteration shape),
//    computes the members in schedule order in registers, each result
//    rounded to its IR dtype as storing and loading it would, and stores the
//    group outputs.
//  - update copy: at the end of a step an update whose new value was not
//    written in place is copied into its target (Graph::updates).
//  - tensors: the named buffers the runtime reads or writes by name: params
//    (initialized, checkpointed, --init), optimizer state (checkpointed), data
//    inputs (filled each step) and the loss.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "analysis/contraction.h"
#include "analysis/memory_plan.h"
#include "analysis/step_kernels.h"
#include "ir/gemm_epilogue.h"
#include "ir/graph.h"
#include "runtime/kernel_spec.h"

namespace napkin::codegen {

struct Operand {
  ir::ValueId value = ir::kNoValue;
  ir::DType dtype = ir::DType::F32;
  int64_t byte_offset = 0;          // of element 0 (the view's Layout::offset included)
  std::vector<int64_t> sizes;       // the value's shape
  std::vector<int64_t> strides;     // in elements; 0 = broadcast
  int64_t numel() const;
  bool contiguous() const;
};

// The step's kernels' kinds (analysis/step_kernels.h) and the GEMM lowering (analysis/contraction.h).
using analysis::ContractionAxis;
using analysis::KernelKind;
using analysis::MatmulLowering;

// An argument of a fused op: the kernel's input `index`, or the result of
// the fused kernel's op `index` (an earlier one).
struct FusedArg {
  bool input = true;
  int index = 0;
};

// One member of a fusion group, as the fused kernel computes it.
struct FusedOp {
  ir::NodeId node = ir::kNoNode;
  ir::Op op = ir::Op::Constant;
  ir::Attrs attrs;
  ir::DType dtype = ir::DType::F32;  // of the result
  std::vector<FusedArg> args;
};

// A fusion group's loop. A group that ends with a reduction is a Reduction
// kernel whose ops are its elementwise prologue, then the reduction (the last
// op): the emitters compute the prologue per element where a plain reduction
// loads its input. Its outputs are the reduction's result (outputs[0]), then
// the prologue results the group stores, each written as its element is
// visited (once; the iteration shape is theirs).
struct FusedLoop {
  std::vector<int64_t> shape;    // the iteration shape
  std::vector<FusedOp> ops;      // schedule order
  std::vector<Operand> outputs;  // the group outputs (Kernel::output is outputs[0])
  std::vector<int> output_ops;   // the op whose result each output stores
};

// One group of a batch (ir/fusion_group.h): its operands, in the order of
// the batch kernel's (Kernel::inputs, FusedLoop::outputs), and its element
// count. Every operand is 0-d or contiguous with numel elements.
struct BatchMember {
  std::vector<Operand> inputs, outputs;
  int64_t numel = 0;
  std::vector<ir::NodeId> nodes;  // its group's members, one per FusedLoop::ops entry
};

// A GEMM's epilogue (ir/gemm_epilogue.h): the Gemm kernel stores
//   D = cast(act(acc + residual + bias))    (and, with a gelu, its input as aux)
//   D = cast(gelu_grad(aux, acc))           (a gelu's gradient)
// where acc is the f32 sums, never stored, and D the kernel's output. The
// kernel's `fused` loop holds the same work as ops (ops[0] the contraction,
// whose result is acc; then the epilogue's adds and cast) for the emitters
// that run it per element (the CPU's per-panel loop); a GEMM library's
// epilogue (cuBLASLt) reads the operands below.
struct GemmEpilogueOperands {
  int residual = -1;  // index in Kernel::inputs of the value added first (cuBLASLt's C), -1: none
  int bias = -1;      // index in Kernel::inputs of the [n] vector added second, -1: none
  ir::GemmActivation activation = ir::GemmActivation::None;
  int aux_input = -1;   // GeluGrad: index in Kernel::inputs of the stored gelu input it reads
  int aux_output = -1;  // Gelu: index in FusedLoop::outputs of the gelu input it stores (1), -1: none
};

struct Kernel {
  KernelKind kind = KernelKind::Elementwise;
  ir::LoopParams params;  // of the op's loop (ir/loop.h); read through the accessors below
  ir::NodeId node = ir::kNoNode;
  ir::Op op = ir::Op::Constant;  // for names and the elementwise formulas; emitters switch on `kind`
  ir::Phase phase = ir::Phase::Forward;
  ir::Attrs attrs;  // the node's
  std::string name;  // "k17_einsum": unique, a valid C identifier
  std::string where;  // "models/gpt.yaml:39:14 (blocks.0)" or "" when unknown
  std::vector<Operand> inputs;
  Operand output;
  // The outputs after `output`, for the kinds that write more than one:
  // Attention's lse (forward) or dk, dv (backward), the classifier's lse
  // (forward) or dw (backward), top_k's indices, moe_slots' src and counts;
  // empty otherwise.
  std::vector<Operand> extra_outputs;
  // A contraction (matmul, einsum): every loop axis with its strides in the
  // inputs and the output; empty for other ops.
  std::vector<ContractionAxis> contraction;
  std::optional<MatmulLowering> matmul;  // kind == Gemm
  // A Gemm with an epilogue (then `fused` is set too, and A and B are
  // inputs 0 and 1); empty for a GEMM that stores its sums as they are.
  std::optional<GemmEpilogueOperands> epilogue;
  // A Gemm that stores its sums and also the sums of B over k, f32 [n], in
  // extra_outputs[0]: a weight gradient's bias gradient (ir/gemm_epilogue.h
  // GemmBiasGrad), this reduction node's result; kNoNode otherwise. Its
  // lowering is one plain product (no batch, operands not swapped).
  ir::NodeId bias_grad = ir::kNoNode;
  // A fused loop kernel (kind == FusedElementwise): `inputs` are the group
  // inputs, `op` and `node` those of its last member; empty otherwise.
  std::optional<FusedLoop> fused;
  // A batch's kernel (FusedElementwise or Reduction, `fused` its first
  // group's): every group's operands, the first group's included; empty for
  // a kernel of one group. The emitters loop over each member's numel.
  std::vector<BatchMember> batch;
  // An optimizer-phase kernel: the parameters whose update it computes
  // (indices in the graph's params), or nullopt when every update needs it
  // (the learning rate, the clip coefficient, the step counter). A rank
  // that owns none of them may skip it (ZeRO-1, docs/distributed.md): what
  // it computes feeds only those parameters' updates.
  std::optional<std::vector<int>> serves;
  // A batch kernel in the optimizer phase: what each member serves, as
  // `serves` (nullopt: shared).
  std::vector<std::optional<std::vector<int>>> member_serves;
  // An all_gather issued ahead of its first use (passes/shard_parameters.h
  // prefetch): the index of the first kernel after it that reads the
  // gathered value, which the gather must be complete before; -1 otherwise
  // (complete before the next kernel).
  int wait_kernel = -1;

  // The parameters of its kind (an internal error for another kind).
  const ir::FillParams& fill() const { return std::get<ir::FillParams>(params); }
  const ir::ReductionParams& reduction() const { return std::get<ir::ReductionParams>(params); }
  const ir::ConcatParams& concat() const { return std::get<ir::ConcatParams>(params); }
  const ir::RowParams& rows() const { return std::get<ir::RowParams>(params); }
  const ir::AttentionParams& attention() const { return std::get<ir::AttentionParams>(params); }
  const ir::CachedAttentionParams& cached_attention() const { return std::get<ir::CachedAttentionParams>(params); }
  const ir::ClassifierParams& classifier() const { return std::get<ir::ClassifierParams>(params); }
  const ir::RopeParams& rope() const { return std::get<ir::RopeParams>(params); }
  const ir::CollectiveParams& collective() const { return std::get<ir::CollectiveParams>(params); }
  const ir::TopKParams& top_k() const { return std::get<ir::TopKParams>(params); }
  const ir::MoeSlotsParams& moe_slots() const { return std::get<ir::MoeSlotsParams>(params); }
};

struct UpdateCopy {
  std::string target;  // the param or state name
  int64_t from = 0, to = 0, bytes = 0;
  std::string param;   // the parameter whose update it is ("" for shared state: optimizer.step)
};

// The runtime's roles (runtime/kernel_spec.h). Rng: the rng tensor
// (ir/rng.h), which the runtime writes before every forward. Output: an
// inference graph's named results (passes/derive_inference.h), in place of a loss.
using runtime::TensorRole;

struct PlannedTensor {
  std::string name;
  TensorRole role = TensorRole::Param;
  std::string param;  // State: the parameter it belongs to ("adam.m.wte": "wte"), "" when shared
  ir::DType dtype = ir::DType::F32;
  std::vector<int64_t> shape;
  int64_t byte_offset = 0;
  int64_t bytes = 0;
  ir::InitSpec init;  // params only
};

// How the runtime launches a loop kernel: the function computes dim-0 indices
// [begin, end) of its loop, extent is that dim's size, and parallel says
// whether splitting it across threads is worth it (backends decide).
// combine: after [0, extent), the runtime calls the function once more with
// [extent, extent + 1), alone: it combines the partial results the work
// items left (a fused reduction over its dim 0, codegen/cpu/kernels.cpp).
struct Launch {
  int64_t extent = 1;
  bool parallel = false;
  bool combine = false;
  // A batch kernel whose dim-0 indices are its members' work items, member
  // after member: how many each has (so a runtime may run some members
  // only: ZeRO-1, docs/distributed.md); empty otherwise.
  std::vector<int64_t> member_work;
};

// A parameter's gradient where the backward leaves it and the optimizer
// phase reads it: bytes [byte_offset, byte_offset + bytes) of the arena,
// dense, in the parameter's element order or a permutation of it (a
// transposed product's buffer), which is all an elementwise collective
// (sum, scale, accumulate) needs. Every gradient is a step output, so its
// buffer is live from the kernel that writes it to the end of the step.
struct PlannedGradient {
  std::string param;
  ir::DType dtype = ir::DType::F32;
  int64_t byte_offset = 0, bytes = 0;
  // The last kernel that writes into it: after that kernel the gradient is
  // final and may be all-reduced while the rest of the backward runs.
  int ready_after = 0;
};

struct KernelPlan {
  int64_t arena_bytes = 0;
  int64_t liveness_peak = 0;
  std::vector<Kernel> kernels;        // schedule order; setup and forward ones first
  // kernels[0 .. n): an inference program's setup (ir::Phase::Setup), run
  // once after the parameters load; none in a training step.
  int num_setup_kernels = 0;
  int num_forward_kernels = 0;        // kernels[num_setup_kernels .. n) compute the loss (eval runs only these)
  // kernels[0 .. n) compute the loss and every gradient; the rest are the
  // optimizer phase. Between the two, every gradient in `gradients` is
  // complete and nothing has read it yet: where the runtime accumulates
  // micro-batches and all-reduces across ranks (docs/distributed.md).
  int num_gradient_kernels = 0;
  std::vector<PlannedGradient> gradients;  // the params' order
  std::vector<UpdateCopy> updates;
  std::vector<PlannedTensor> tensors;  // params, state, inputs, the rng tensor (if any), then the loss
};

// The plan of a training graph (after the training pipeline). Internal error
// if the graph has no "loss" output.
KernelPlan plan_kernels(const ir::Graph& g);

// A forward attention kernel's output o as the backends address it, [batch,
// heads, seq, head_dim]: Kernel::output, its sizes and strides permuted where
// the op stores o seq-major (ir/loop.h AttentionParams::seq_major_out).
Operand attention_output(const Kernel& k);
// A backward attention kernel's dq, dk and dv as the backends address them,
// [batch, heads, seq, head_dim] each: Kernel::output and extra_outputs, or
// three strided windows of the one packed output (AttentionParams::packed_grad).
std::vector<Operand> attention_gradients(const Kernel& k);

// The runtime's description (runtime/rope.h) of the rotation `p` makes of
// rows of `dim` elements: what a Rope kernel's runners and emitters rotate by.
runtime::RopeDesc rope_desc(const ir::RopeParams& p, int64_t dim);

}  // namespace napkin::codegen

namespace napkin::codegen {

// Merges adjacent dims d, d+1 of a loop over `sizes` where every operand's
// strides allow it (strides[d] == strides[d+1] * sizes[d+1]) and drops size-1
// dims, so a loop nest has as few, as long, loops as possible. An empty
// result becomes {1} (one element).
void collapse_dims(std::vector<int64_t>& sizes, const std::vector<std::vector<int64_t>*>& strides);

// The strides of `o` read as a tensor of shape `to` (numpy broadcasting:
// aligned on the right, size-1 and missing dims get stride 0).
std::vector<int64_t> broadcast_strides(const Operand& o, const std::vector<int64_t>& to);

// An axis attribute (negative counts from the end) as an index below `rank`.
int normalize_axis(int64_t axis, size_t rank);

// The loop of a reduce_* kernel: the input's dims, collapsed, with the
// input's strides and the output's (0 along a reduced dim: every element of
// it lands on one output element). A fused reduction (Kernel::fused) loops
// over its iteration shape: `inputs` holds each kernel input's strides over
// it (broadcast: 0), in_strides those of input 0, and `stores` the strides
// of the prologue results it stores; a plain one has one input.
struct ReductionLoop {
  std::vector<int64_t> sizes, in_strides, out_strides;
  std::vector<std::vector<int64_t>> inputs;
  // A fused reduction's other outputs (FusedLoop::outputs[1..]): their strides over the loop.
  std::vector<std::vector<int64_t>> stores;
};
ReductionLoop reduction_loop(const Kernel& k);

// The loop of a Rows kernel (its variants: ir/loop.h's RowVariant): it works
// on rows, the elements along one axis of input 0, and loops over every
// other dim (collapsed where every operand allows).
//  - operand shapes: Full operands have input 0's shape; PerRow ones (the
//    cross-entropy targets) lack the axis; Vector ones (norm gains and
//    biases, and a norm gradient's gain and bias gradients) are only the axis.
//  - operands, in order: input 0, the variant's other row-shaped inputs,
//    then the output (none for CrossEntropy, whose scalar output is a sum
//    over rows), then a norm gradient's gain and bias gradients (Vector).
//    Each has its strides over the loop's dims and its step along the axis,
//    so element k of a row is at (row base) + k * step.
enum class RowShape : uint8_t { Full, PerRow, Vector };
struct RowOperand {
  const Operand* op = nullptr;
  RowShape shape = RowShape::Full;
  bool input = true;
  std::vector<int64_t> strides;  // over the loop's dims
  int64_t step = 0;              // along the axis
};
struct RowLoop {
  int axis = 0;
  int64_t n = 1;               // the row length
  std::vector<int64_t> sizes;  // the loop over rows
  std::vector<RowOperand> operands;
};
RowLoop row_loop(const Kernel& k);

// The loop of a Gather (embedding) or ScatterAdd (its gradient) kernel: over
// the positions of the ids (collapsed), each id picking a row of the
// vocabulary-indexed tensor (the table; for ScatterAdd, its output), which
// goes to (or is summed from) the position's row of the dense tensor (the
// output; for ScatterAdd, dy).
struct EmbeddingLoop {
  int64_t vocab = 0;
  std::vector<int64_t> id_sizes, id_strides, dense_id_strides;  // over the positions
  std::vector<int64_t> row_sizes, row_table, row_dense;          // over a row
};
EmbeddingLoop embedding_loop(const Kernel& k);

}  // namespace napkin::codegen
