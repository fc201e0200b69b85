// The contract between the compiler and the engines: one kernel of a
// program as codegen describes it and an engine runs it (XLA's Thunk is the
// model). A kernel is its common facts (name, phase, output, the time
// model's view) and one payload, a std::variant of one struct per kind.
//
// Adding a kernel kind (docs/architecture.md) is one payload struct here (with
// its `kind` name), its JSON in runtime/program.cpp, one emitter per backend
// and one runner per engine (runtime/executor.cpp, runtime/cuda/cuda_engine.cpp):
// every std::visit over KernelPayload then fails to compile until it has one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "runtime/attention.h"
#include "runtime/cached_attention.h"
#include "runtime/classifier.h"
#include "runtime/matmul_desc.h"
#include "runtime/rope.h"
#include "runtime/routing.h"
#include "runtime/tensor_types.h"

namespace napkin::runtime {

// A generated loop function called over work items [0, extent) (split
// across threads when parallel); with combine, called once more with
// [extent, extent + 1) (codegen/plan.h Launch).
struct LoopSpec {
  static constexpr const char* kind = "loop";
  int64_t extent = 1;
  bool parallel = false, combine = false;
  // A CPU batch kernel in the optimizer phase: its members in order, each
  // with its work items (consecutive dim-0 indices) and what it serves.
  struct Member {
    int64_t work = 0;
    std::vector<std::string> serves;
    bool shared = true;
    bool operator==(const Member&) const = default;
  };
  std::vector<Member> members;
  bool operator==(const LoopSpec&) const = default;
};

// A GEMM epilogue (codegen/plan.h GemmEpilogueOperands): the product's f32
// sums are not stored at c; D = cast(act(sums + residual + bias)) is, at d
// (or D = cast(gelu'(aux) * sums), a gelu's gradient). The
// CPU runs the kernel's generated loop function on each panel of sums
// (runtime/executor.h); CUDA, cuBLASLt's bias epilogue and C operand.
struct GemmEpilogueSpec {
  int64_t d = 0, residual = -1, bias = -1;  // byte offsets; -1: none (the residual is [rows, n] as D, the bias [n] f32)
  DType d_dtype = DType::F32;               // f32, bf16 or f16
  // Gelu: D = gelu(...), aux (if >= 0) = its input stored in D's dtype;
  // GeluGrad: D = gelu'(aux) * sums, aux read.
  GemmActivation activation = GemmActivation::None;
  int64_t aux = -1;  // byte offset of the gelu's input ([rows, n] in D's dtype), -1: none
  int64_t rows = 1;  // the CPU's epilogue function's work items (the program's "extent")
  bool operator==(const GemmEpilogueSpec&) const = default;
};

struct MatmulSpec {
  static constexpr const char* kind = "matmul";
  int64_t a = 0, b = 0, c = 0;  // byte offsets of the operands' first elements
  DType a_dtype = DType::F32, b_dtype = DType::F32, c_dtype = DType::F32;  // runtime/gemm.h says which mix
  MatmulDesc desc;
  std::optional<GemmEpilogueSpec> epilogue;
  // Byte offset of the f32 [n] sums of B over k, stored besides C (a weight
  // gradient's GEMM storing its layer's bias gradient: cuBLASLt's BGRADA on
  // CUDA, runtime/gemm.h sum_b_over_k on the CPU); -1: none. Not with an
  // epilogue or a batch; C is f32.
  int64_t bias_grad = -1;
  bool operator==(const MatmulSpec&) const = default;
};

// A fused attention kernel (runtime/attention.h): its descriptor and where
// each operand starts in the arena (do, dq, dk, dv: backward only).
struct AttentionSpec {
  static constexpr const char* kind = "attention";
  bool backward = false;
  DType dtype = DType::F32;
  AttentionDesc desc;
  int64_t q = 0, k = 0, v = 0, o = 0, lse = 0, d_o = 0, dq = 0, dk = 0, dv = 0;  // byte offsets
  bool operator==(const AttentionSpec&) const = default;
};

// An attention against a KV cache (runtime/cached_attention.h): its
// descriptor and where each operand starts in the arena.
struct CachedAttentionSpec {
  static constexpr const char* kind = "cached_attention";
  DType dtype = DType::F32;
  CachedAttentionDesc desc;
  int64_t q = 0, k = 0, v = 0, k_cache = 0, v_cache = 0, o = 0, positions = 0;  // byte offsets
  bool operator==(const CachedAttentionSpec&) const = default;
};

// A standalone rope kernel (runtime/rope.h RopeKernel): its descriptor and
// where its operands start in the arena (positions: explicit ones only).
struct RopeSpec {
  static constexpr const char* kind = "rope";
  DType dtype = DType::F32;
  RopeKernelDesc desc;
  int64_t x = 0, y = 0, positions = -1;  // byte offsets; positions -1: the index along seq_axis
  bool operator==(const RopeSpec&) const = default;
};

// A top_k kernel (runtime/routing.h): its descriptor and where x, the
// values and the indices start in the arena.
struct TopKSpec {
  static constexpr const char* kind = "top_k";
  DType dtype = DType::F32;  // x's and the values'
  TopKDesc desc;
  int64_t x = 0, values = 0, indices = 0;  // byte offsets
  bool operator==(const TopKSpec&) const = default;
};

// A moe_slots kernel (runtime/routing.h): its descriptor and where the
// indices and its three results start in the arena.
struct MoeSlotsSpec {
  static constexpr const char* kind = "moe_slots";
  MoeSlotsDesc desc;
  int64_t indices = 0, pos = 0, src = 0, counts = 0;  // byte offsets
  bool operator==(const MoeSlotsSpec&) const = default;
};

// A collective kernel (ir/loop.h Collective): `count` elements of `dtype`
// at x copied to y (the same bytes or others), then, where the engine was
// given collectives (Engine::set_collectives), what the ranks do together:
//  - "all_reduce_sum" (f32): y summed over the ranks (ZeRO-2's parts);
//  - "all_gather": y from `param`'s owner, on every rank (ZeRO-3);
//  - "reduce_scatter": y summed over the ranks onto `param`'s owner (ZeRO-3).
// Without, the copy is all: the identity of one process, or of a job whose
// ranks each hold the whole value already.
// `wait`: a gather issued ahead of its use (passes/shard_parameters.h
// prefetch) may run while the kernels after it do, and must be complete
// before kernel `wait` (the first that reads y); -1: before the next kernel.
struct CollectiveSpec {
  static constexpr const char* kind = "collective";
  std::string collective;  // ir::collective_name
  int64_t x = 0, y = 0, count = 0;  // byte offsets; elements
  DType dtype = DType::F32;
  std::string param;  // all_gather, reduce_scatter: the parameter
  int64_t wait = -1;  // index of the kernel it must be complete before; -1: the next
  bool operator==(const CollectiveSpec&) const = default;
};

// A classifier kernel on backend "cuda": the vocabulary in `chunks` chunks
// of `chunk` classes, and the byte offsets in the scratch buffer of the
// chunk's logits and of dx's f32 sums (-1: none; codegen/cuda/kernel_source.h,
// CudaClassifierLayout). At namespace scope, not nested in ClassifierSpec:
// clang does not see a nested struct's member initializers, so its
// default-constructibility, until the enclosing class is complete.
struct ClassifierCudaChunks {
  int64_t chunk = 0, chunks = 0, logits = 0, dx_acc = -1;
  bool operator==(const ClassifierCudaChunks&) const = default;
};

// A fused classifier kernel (runtime/classifier.h): its descriptor and where
// each operand starts in the arena (loss forward; dloss, dx, dw backward).
struct ClassifierSpec {
  static constexpr const char* kind = "classifier";
  using Cuda = ClassifierCudaChunks;
  bool backward = false;
  DType dtype = DType::F32;
  ClassifierDesc desc;
  int64_t x = 0, w = 0, targets = 0, loss = 0, lse = 0, dloss = 0, dx = 0, dw = 0;  // byte offsets
  std::optional<Cuda> cuda;  // backend cuda only
  bool operator==(const ClassifierSpec&) const = default;
};

using KernelPayload = std::variant<LoopSpec, MatmulSpec, AttentionSpec, CachedAttentionSpec, ClassifierSpec, RopeSpec,
                                   CollectiveSpec, TopKSpec, MoeSlotsSpec>;

// One launch of a CUDA kernel function (backend "cuda"; codegen/cuda/kernel_source.h).
struct CudaLaunchSpec {
  std::string function;
  int64_t grid = 1;
  int block = 1, shared_bytes = 0;
  std::vector<int64_t> offsets;  // the function's third parameter: operand byte offsets in the arena
  bool operator==(const CudaLaunchSpec&) const = default;
};

struct KernelSpec {
  std::string name, where;
  KernelPhase phase = KernelPhase::Forward;
  KernelPayload payload;
  int64_t out_offset = 0, out_numel = 0;
  DType out_dtype = DType::F32;
  // Backend "cuda", every kind but a GEMM: the kernel's launches in order
  // (a classifier's GEMMs run between them).
  std::vector<CudaLaunchSpec> cuda_launches;
  // Optimizer phase: the parameters whose update the kernel computes; empty
  // with `shared` when every rank runs it (codegen/plan.h Kernel::serves).
  std::vector<std::string> serves;
  bool shared = true;
  // The time model's view of the kernel (analysis/step_time.h), when the
  // device is known: its class ("matmul", "attention", ...), work, and
  // predicted seconds (-1: the device has no peak for its dtype).
  std::string kernel_class;
  double flops = 0, bytes = 0, predicted_seconds = -1;

  // The payload when it is a T, else null.
  template <class T>
  const T* as() const {
    return std::get_if<T>(&payload);
  }
  bool operator==(const KernelSpec&) const = default;
};

// std::visit(overloaded{[](const LoopSpec&) {...}, ...}, payload): one
// lambda per kind, and a kind without one does not compile.
template <class... Fs>
struct overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
overloaded(Fs...) -> overloaded<Fs...>;

}  // namespace napkin::runtime
