// Building blocks of the CUDA kernel emitters (codegen/cuda/*.cpp): C source
// text for loads and stores of arena operands with dtype conversion, 16-byte
// vector loads and stores, index arithmetic over a loop shape, and launch
// shapes. Internal to codegen/cuda.
//
// Terms:
//  - compute type / storage type: see codegen/cuda/prelude.cpp.
//  - element index: of an operand, in elements from its element 0 (the
//    operand's byte offset); the generated code reaches it as
//    ((T*)(arena + OFFSET))[index], OFFSET being the operand's offset marker.
//  - markers: the emitters write a plan kernel's functions with three kinds
//    of placeholder that emit_cuda_source (kernel_source.cpp) replaces when
//    it parameterizes the offsets and merges identical kernels:
//      offset marker  `$oN$` (scalar access) or `$vN$` (16-byte vector
//                     access, which needs N % 16 == 0): the byte offset N of
//                     an operand; becomes `off.at[slot]`;
//      kSlotCountMarker  the plan kernel's number of offset slots, in the
//                     signature's NAPKIN_OFFSETS(n);
//      kNameMarker    the plan kernel's name, which the emitters see as
//                     k.name and use as the prefix of every name they make
//                     (functions NAME, NAME_2, NAME_3; NAME_elem); becomes
//                     the name of the function's first plan kernel.
//  - chunk: E consecutive elements (along the innermost loop dim) that one
//    thread moves with 16-byte (uint4) loads and stores; E = 16 / the
//    smallest element size among the operands moved so, so an operand of
//    element size s moves E * s / 16 uint4 words per chunk.
//  - index type: "unsigned" when every index and element offset a kernel
//    computes fits in 32 bits (cheaper division by constants), else
//    "unsigned long long".
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "codegen/cuda/launch.h"
#include "codegen/plan.h"

namespace napkin::codegen::cuda::detail {

// H100 SXM: the launch shapes aim at filling this many SMs.
constexpr int64_t kSMs = 132;
// Grid-stride kernels launch at most this many blocks (about two waves of
// 256-thread blocks at full occupancy); more work loops inside.
constexpr int64_t kMaxGrid = kSMs * 16;

constexpr const char* kSlotCountMarker = "$n$";
constexpr const char* kNameMarker = "$f$";

// One plan kernel's CUDA C: its functions and their launches (whose offsets
// emit_cuda_source fills in).
struct EmittedKernel {
  std::string text;
  std::vector<CudaLaunch> launches;
  int64_t scratch_bytes = 0;
};

// A source text builder with indentation.
class Src {
 public:
  template <typename... A>
  void line(fmt::format_string<A...> f, A&&... args) {
    text_.append(static_cast<size_t>(depth_) * 2, ' ');
    fmt::format_to(std::back_inserter(text_), f, std::forward<A>(args)...);
    text_ += '\n';
  }
  // A line ending in '{' that opens a scope, and the '}' that closes it.
  template <typename... A>
  void open(fmt::format_string<A...> f, A&&... args) {
    line(f, std::forward<A>(args)...);
    ++depth_;
  }
  void close(std::string_view tail = "}") {
    --depth_;
    line("{}", tail);
  }
  std::string take() { return std::move(text_); }

 private:
  std::string text_;
  int depth_ = 0;
};

const char* storage_type(ir::DType t);
const char* compute_type(ir::DType t);
int compute_size(ir::DType t);  // bytes of the compute type (bool: 1)

// A literal of t's compute type with value v (exact for float/double:
// hex-float literals).
std::string literal(ir::DType t, double v);
// The rotary frequencies of a rope over `dim` elements as the __device__
// array `name` of dim / 2 f32 values: the CPU runtime's (runtime/rope.h
// rope_inv_freq), so both backends turn by the same angles.
void emit_rope_frequencies(Src& s, const std::string& name, const ir::RopeParams& p, int64_t dim);
// Compute-type expressions: the raw storage value `raw` converted; `v`
// rounded to storage bits; `v` as storing and loading it gives it.
std::string from_storage(ir::DType t, const std::string& raw);
std::string to_storage(ir::DType t, const std::string& v);
std::string as_stored(ir::DType t, const std::string& v);
// A compute value of dtype `from` in `to`'s compute type (the CPU backend's
// LoopEmitter::convert: integers toward zero, saturating, NaN -> 0).
std::string convert(const std::string& v, ir::DType from, ir::DType to);

// o's offset marker, for a scalar or a 16-byte vector access.
std::string offset_marker(const Operand& o, bool vector);
// ((T*)(arena + OFFSET)) for operand o.
std::string pointer(const Operand& o);
// Element `index` of o in its compute type, and the statement storing v.
std::string load(const Operand& o, const std::string& index);
std::string store(const Operand& o, const std::string& index, const std::string& v);

// Loads E elements of o from element index `at` (a multiple of 16 / size,
// 16-byte aligned) with uint4 loads; dst(e) names where element e goes.
void vector_load(Src& s, const Operand& o, const std::string& at, int E, const std::function<std::string(int)>& dst);
// Stores E elements (src(e): compute-type expressions) at element index `at`.
void vector_store(Src& s, const Operand& o, const std::string& at, int E, const std::function<std::string(int)>& src);
// Whether element index 0 + sum idx_d * strides[d] of o is 16-byte aligned
// for every index: the byte offset and every nonzero stride's bytes are
// multiples of 16.
bool aligned16(const Operand& o, const std::vector<int64_t>& strides);

// "unsigned" when `bound` (the largest value an index expression takes) fits
// comfortably in 32 bits, else "unsigned long long".
std::string index_type(int64_t bound);
// The largest element index o reaches over loop `sizes` with `strides`.
int64_t max_offset(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides);
// Declares `prefix`0 .. `prefix`(n-1), the multi-index of flat index `flat`
// over `sizes` (row-major).
void decompose(Src& s, const std::vector<int64_t>& sizes, const std::string& flat, const std::string& prefix,
               const std::string& index_t);
// sum prefix_d * strides[d] as an expression ("0" when all strides are 0).
std::string dot(const std::string& prefix, const std::vector<int64_t>& strides);

// The opening line of a kernel function (kernel_source.h, signature);
// `block` is its __launch_bounds__.
std::string kernel_signature(const std::string& name, int block);
// Opens a kernel function (closed by s.close()); marks `scratch` used for
// kernels that take none.
void begin_kernel(Src& s, const std::string& name, int block);
// Blocks for `items` work items of `per_block` each, at most `max_grid`.
int64_t grid_for(int64_t items, int64_t per_block, int64_t max_grid = kMaxGrid);
// Threads per block for `items` items: a multiple of 32, at most `max_block`.
int block_for(int64_t items, int max_block = 256);

int64_t product(const std::vector<int64_t>& v);

// The per-family emitters (one plan kernel each; `index` is its plan index,
// which NAPKIN_BAD_INDEX reports).
EmittedKernel emit_elementwise(const Kernel& k);      // elementwise ops and fused loop kernels
// A reduction's combining step and identity, in dtype t's compute type.
struct Combine {
  std::string op;        // prelude combiner: napkin_sum_op(), napkin_max_op(), napkin_min_op()
  std::string identity;  // of the accumulator type
};
Combine combine_of(ir::Combiner c, ir::DType t);
EmittedKernel emit_batch(const Kernel& k);            // a batch's kernel: a table of tensors (codegen/cuda/batches.cpp)
// Whether a batch's kernel runs only the members its run mask says (an
// optimizer batch of updates: ZeRO's ranks run their own parameters').
bool runs_members_apart(const Kernel& k);
// The lines `const T vJ = ...;` computing a fused kernel's ops [0, count)
// from its inputs' compute values a0, a1, ..., each rounded to its dtype.
void fused_ops(Src& f, const Kernel& k, size_t count);
EmittedKernel emit_fill(const Kernel& k);             // constant, arange
EmittedKernel emit_concat_or_pad(const Kernel& k);
EmittedKernel emit_collective(const Kernel& k);      // a collective on one device: a copy
EmittedKernel emit_embedding(const Kernel& k, int index);
EmittedKernel emit_contraction(const Kernel& k);      // a contraction the GEMM library cannot take
EmittedKernel emit_reduction(const Kernel& k);        // reduce_sum/mean/max/min, and fused reductions
// A fused reduction's prologue (codegen/plan.h FusedLoop) as the device
// function `T fn(inputs' compute values, T0& s0, ...)` returning the reduced
// member's value and setting s0, s1, ... to the results the kernel stores
// (FusedLoop::outputs[1..]).
std::string fused_prologue(const Kernel& k, const std::string& fn);
EmittedKernel emit_mse(const Kernel& k);
EmittedKernel emit_embedding_grad(const Kernel& k, int index);
EmittedKernel emit_rows(const Kernel& k, int index);  // softmax, norms, cross-entropy and their gradients
EmittedKernel emit_attention(const Kernel& k);        // fused attention, forward or backward (codegen/cuda/attention.cpp)
EmittedKernel emit_cached_attention(const Kernel& k, int index);  // attention against a KV cache (codegen/cuda/cached_attention.cpp)
EmittedKernel emit_rope(const Kernel& k);             // the standalone rope (codegen/cuda/rope.cpp)
EmittedKernel emit_top_k(const Kernel& k);            // top_k (codegen/cuda/routing.cpp)
EmittedKernel emit_moe_slots(const Kernel& k, int index);  // moe_slots (codegen/cuda/routing.cpp)
EmittedKernel emit_classifier(const Kernel& k, int index, const CudaClassifierLayout& layout);  // the fused classifier's row work (codegen/cuda/classifier.cpp)
// The attention device templates the prelude ends with (attention_device.cpp).
std::string_view attention_prelude();

}  // namespace napkin::codegen::cuda::detail
