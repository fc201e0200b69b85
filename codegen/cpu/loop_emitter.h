// The building blocks of a CPU kernel in LLVM IR: counted loops, loop nests
// over a shape, and loads/stores of arena operands with dtype conversion.
//
// Every kernel's code is `void body(ptr arena, i64 begin, i64 end, ptr offsets)`:
// the runtime's arena, the part [begin, end) of the kernel's parallel dim
// that this thread computes (codegen/cpu/kernels.h says which dim that is),
// and where its operands are: a slot per distinct operand byte offset,
// numbered by first use, offsets[slot] (i64) its bytes from the arena. The
// offsets being a parameter, kernels that differ only in where their
// operands live (a transformer's layers) are the same code
// (codegen/cpu/cpu_backend.h). A GEMM epilogue takes its panel of sums
// before `offsets`.
//
// Values are computed in a "compute type": f32 for f32, f16, bf16 and the
// 8-bit floats (converted on load, exactly; rounded to nearest even on store,
// with subnormals), f64 for f64, the integer itself for i32 and i64, i1 for
// bool (stored as one byte). f16 stores are LLVM's fptrunc; bf16 (stored as
// i16 bits), f8e4m3 and f8e5m2 (i8) are converted by integer bit
// manipulation, with the bits of runtime/float_formats.h: E4M3 has no inf
// (too large -> NaN), E5M2 overflows to inf.
#pragma once

#include <llvm/IR/IRBuilder.h>

#include <functional>
#include <vector>

#include "codegen/plan.h"

namespace napkin::codegen::cpu {

class LoopEmitter {
 public:
  LoopEmitter(llvm::Function* fn, llvm::IRBuilder<>& builder);

  llvm::IRBuilder<>& b;
  llvm::LLVMContext& ctx;
  llvm::Module& module;
  llvm::Function* fn;
  llvm::Value* arena;
  llvm::Value* begin;
  llvm::Value* end;

  llvm::Value* i64(int64_t v) { return b.getInt64(v); }
  llvm::Type* compute_type(ir::DType t);
  llvm::Value* constant(ir::DType t, double v);  // of t's compute type

  // for (i = lo; i < hi; ++i) body(i), i an i64.
  void loop(llvm::Value* lo, llvm::Value* hi, const std::function<void(llvm::Value*)>& body);
  // A loop nest over `sizes`, outermost first; dim `split` (if >= 0) runs
  // over [begin, end) instead of [0, size). body gets one index per dim.
  void nest(const std::vector<int64_t>& sizes, int split, const std::function<void(const std::vector<llvm::Value*>&)>& body);
  // sum idx[d] * strides[d] (+ base), folding zero strides away.
  llvm::Value* dot(const std::vector<llvm::Value*>& idx, const std::vector<int64_t>& strides, llvm::Value* base = nullptr);

  // Element `index` (elements from the operand's first element) of o, from
  // its slot or, where given, from `base` (a batch member's operand, whose
  // offset the kernel reads from a table of its own: codegen/cpu/kernels.cpp).
  llvm::Value* element_ptr(const Operand& o, llvm::Value* index, llvm::Value* base = nullptr);
  // Per slot, the byte offset the kernel's operands have there.
  std::vector<int64_t> slot_offsets() const;
  // Constant offsets let LLVM prove that operands do not overlap; slots do
  // not. After the body is emitted, this tells it so: the accesses through a
  // slot whose bytes meet no other slot's get scoped noalias metadata against
  // every other slot's (what inlining a noalias argument gives), in a
  // kernel of at most kMaxMarkedSlots slots.
  static constexpr size_t kMaxMarkedSlots = 64;
  void mark_disjoint_slots();
  llvm::Value* load(const Operand& o, llvm::Value* index, llvm::Value* base = nullptr);           // in o's compute type
  void store(const Operand& o, llvm::Value* index, llvm::Value* v, llvm::Value* base = nullptr);  // v in o's compute type
  // v (in t's compute type) as storing it as t and loading it back gives it,
  // bit for bit: a fused kernel rounds each member's result so.
  llvm::Value* as_stored(llvm::Value* v, ir::DType t);
  // Converts a compute value of dtype `from` to the compute type of `to`
  // (integers toward zero, saturating, NaN -> 0; bool is != 0).
  llvm::Value* convert(llvm::Value* v, ir::DType from, ir::DType to);
  // A value of t's storage type to its compute type, and back (rounding).
  llvm::Value* from_storage(llvm::Value* raw, ir::DType t);
  llvm::Value* to_storage(llvm::Value* v, ir::DType t);

  // A scalar accumulator (an alloca in the entry block that mem2reg promotes).
  llvm::Value* make_slot(llvm::Type* t, llvm::Value* init);
  // Reassociable float ops let the vectorizer split a sum into vector lanes.
  llvm::Value* add_reassoc(llvm::Value* a, llvm::Value* b);
  // The runtime's hook for an embedding/class id outside [0, bound): reports
  // the kernel and exits (runtime/executor.cpp).
  void check_index(llvm::Value* id, int64_t bound, int kernel_index);

 private:
  llvm::BasicBlock* entry_;
  llvm::Value* offsets_;
  struct Slot {
    int64_t offset, first_byte, end_byte;  // the bytes its operands span
    llvm::Value* base;                     // arena + offsets[slot], at entry
  };
  std::vector<Slot> slots_;
};

}  // namespace napkin::codegen::cpu
