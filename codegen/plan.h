// The kernel plan: a training step as a backend sees it. Backend-neutral: the
// CPU backend (codegen/cpu) turns each loop kernel into an LLVM function, the
// CUDA backend into a CUDA C kernel; both hand contractions to a GEMM library.
//
// Terms:
//  - operand: where a kernel reads or writes one tensor: a byte offset into
//    the arena (analysis/memory_plan.h) plus sizes and element strides, so a view
//    (transpose, broadcast, slice) is read in place, never copied.
//  - kernel: one non-view node of the schedule, or one fusion group
//    (ir/fusion_group.h), in schedule order. A Matmul kernel is a contraction
//    the GEMM library runs (codegen/contraction.h); a Loop kernel is
//    everything else, generated code.
//  - fused loop kernel: a Loop kernel with `fused` set. It loops over the
//    group's iteration shape; per element it loads the group inputs (each
//    read by its own strides, broadcast to the iteration shape), computes the
//    members in schedule order in registers, each result rounded to its IR
//    dtype as storing and loading it would, and stores the group outputs.
//  - update copy: at the end of a step an update whose new value was not
//    written in place is copied into its target (Graph::updates).
//  - tensors: the named buffers the runtime reads or writes by name: params
//    (initialized, checkpointed, --init), optimizer state (checkpointed), data
//    inputs (filled each step) and the loss.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/memory_plan.h"
#include "codegen/contraction.h"
#include "ir/graph.h"

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

enum class KernelKind : uint8_t { Loop, Matmul };

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

struct FusedLoop {
  std::vector<int64_t> shape;    // the iteration shape
  std::vector<FusedOp> ops;      // schedule order
  std::vector<Operand> outputs;  // the group outputs (Kernel::output is outputs[0])
  std::vector<int> output_ops;   // the op whose result each output stores
};

struct Kernel {
  KernelKind kind = KernelKind::Loop;
  ir::NodeId node = ir::kNoNode;
  ir::Op op = ir::Op::Constant;
  ir::Phase phase = ir::Phase::Forward;
  ir::Attrs attrs;  // the node's
  std::string name;  // "k17_einsum": unique, a valid C identifier
  std::string where;  // "models/gpt.yaml:39:14 (blocks.0)" or "" when unknown
  std::vector<Operand> inputs;
  Operand output;
  // A contraction (matmul, einsum): every loop axis with its strides in the
  // inputs and the output; empty for other ops.
  std::vector<ContractionAxis> contraction;
  std::optional<MatmulLowering> matmul;  // kind == Matmul
  // A fused loop kernel (kind == Loop): `inputs` are the group inputs, `op`
  // and `node` those of its last member; empty otherwise.
  std::optional<FusedLoop> fused;
};

struct UpdateCopy {
  std::string target;  // the param or state name
  int64_t from = 0, to = 0, bytes = 0;
};

// Rng: the rng tensor (ir/rng.h), which the runtime writes before every forward.
enum class TensorRole : uint8_t { Param, State, Input, Rng, Loss };
std::string_view tensor_role_name(TensorRole r);  // "param", "state", "input", "rng", "loss"

struct PlannedTensor {
  std::string name;
  TensorRole role = TensorRole::Param;
  ir::DType dtype = ir::DType::F32;
  std::vector<int64_t> shape;
  int64_t byte_offset = 0;
  int64_t bytes = 0;
  ir::InitSpec init;  // params only
};

// How the runtime launches a Loop kernel: the function computes dim-0 indices
// [begin, end) of its loop, extent is that dim's size, and parallel says
// whether splitting it across threads is worth it (backends decide).
struct Launch {
  int64_t extent = 1;
  bool parallel = false;
};

struct KernelPlan {
  int64_t arena_bytes = 0;
  int64_t liveness_peak = 0;
  std::vector<Kernel> kernels;        // schedule order; forward ones first
  int num_forward_kernels = 0;        // kernels[0 .. n) compute the loss (eval runs only these)
  std::vector<UpdateCopy> updates;
  std::vector<PlannedTensor> tensors;  // params, state, inputs, the rng tensor (if any), then the loss
};

// What an elementwise op reads of its element's position besides its
// operands: nothing, its (row, column) in the last two dims (triu,
// causal_mask), or its row-major index in the output (dropout: the index
// keys the element's random draw). Both backends' elementwise and fused
// kernels provide it.
enum class ElementIndex : uint8_t { None, RowCol, Flat };
ElementIndex element_index(ir::Op op);

// The plan of a training graph (after the training pipeline). Internal error
// if the graph has no "loss" output.
KernelPlan plan_kernels(const ir::Graph& g);

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
// it lands on one output element).
struct ReductionLoop {
  std::vector<int64_t> sizes, in_strides, out_strides;
};
ReductionLoop reduction_loop(const Kernel& k);

// The loop of a row kernel (softmax, log_softmax, softmax_grad, layernorm,
// rmsnorm and their gradients, norm_gain_grad, cross_entropy and its
// gradient): it works on rows, the elements along one axis of input 0, and
// loops over every other dim (collapsed where every operand allows).
//  - operand shapes: Full operands have input 0's shape; PerRow ones (the
//    cross-entropy targets) lack the axis; Vector ones (norm gains, the
//    norm_gain_grad output) are only the axis.
//  - operands, in order: input 0, the op's other row-shaped inputs, then the
//    output (none for cross_entropy, whose scalar output is a sum over rows).
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

// The loop of an embedding or its gradient: over the positions of the ids
// (collapsed), each id picking a row of the vocabulary-indexed tensor (the
// table; for the gradient, its output), which goes to (or is summed from) the
// position's row of the dense tensor (the output; for the gradient, dy).
struct EmbeddingLoop {
  int64_t vocab = 0;
  std::vector<int64_t> id_sizes, id_strides, dense_id_strides;  // over the positions
  std::vector<int64_t> row_sizes, row_table, row_dense;          // over a row
};
EmbeddingLoop embedding_loop(const Kernel& k);

}  // namespace napkin::codegen
