#include "codegen/cpu/loop_emitter.h"

#include <llvm/IR/Instructions.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "ir/internal_check.h"

namespace napkin::codegen::cpu {

LoopEmitter::LoopEmitter(llvm::Function* f, llvm::IRBuilder<>& builder)
    : b(builder), ctx(f->getContext()), module(*f->getParent()), fn(f) {
  entry_ = llvm::BasicBlock::Create(ctx, "entry", fn);
  b.SetInsertPoint(entry_);
  auto args = fn->arg_begin();
  arena = &*args++;
  begin = &*args++;
  end = &*args;
  offsets_ = fn->getArg(fn->arg_size() - 1);
}

llvm::Type* LoopEmitter::compute_type(ir::DType t) {
  switch (t) {
    case ir::DType::F64: return b.getDoubleTy();
    case ir::DType::F32:
    case ir::DType::F16:
    case ir::DType::BF16:
    case ir::DType::F8E4M3:
    case ir::DType::F8E5M2: return b.getFloatTy();
    case ir::DType::I32: return b.getInt32Ty();
    case ir::DType::I64: return b.getInt64Ty();
    case ir::DType::Bool: return b.getInt1Ty();
  }
  NAPKIN_INTERNAL_CHECK(false, "unknown dtype {}", static_cast<int>(t));
  return nullptr;
}

llvm::Value* LoopEmitter::constant(ir::DType t, double v) {
  llvm::Type* ty = compute_type(t);
  if (ty->isFloatingPointTy()) return llvm::ConstantFP::get(ty, v);
  if (ty->isIntegerTy(1)) return b.getInt1(v != 0);
  return llvm::ConstantInt::get(ty, static_cast<int64_t>(v), true);
}

void LoopEmitter::loop(llvm::Value* lo, llvm::Value* hi, const std::function<void(llvm::Value*)>& body) {
  llvm::BasicBlock* pre = b.GetInsertBlock();
  llvm::BasicBlock* header = llvm::BasicBlock::Create(ctx, "loop", fn);
  llvm::BasicBlock* exit = llvm::BasicBlock::Create(ctx, "loop.end", fn);
  // Guard so that an empty range runs nothing (the body block is the header).
  b.CreateCondBr(b.CreateICmpSLT(lo, hi), header, exit);
  b.SetInsertPoint(header);
  llvm::PHINode* i = b.CreatePHI(b.getInt64Ty(), 2, "i");
  i->addIncoming(lo, pre);
  body(i);
  llvm::Value* next = b.CreateAdd(i, i64(1), "i.next", /*HasNUW=*/true, /*HasNSW=*/true);
  i->addIncoming(next, b.GetInsertBlock());
  b.CreateCondBr(b.CreateICmpSLT(next, hi), header, exit);
  b.SetInsertPoint(exit);
}

void LoopEmitter::nest(const std::vector<int64_t>& sizes, int split,
                       const std::function<void(const std::vector<llvm::Value*>&)>& body) {
  std::vector<llvm::Value*> idx(sizes.size(), nullptr);
  std::function<void(size_t)> level = [&](size_t d) {
    if (d == sizes.size()) {
      body(idx);
      return;
    }
    llvm::Value* lo = static_cast<int>(d) == split ? begin : i64(0);
    llvm::Value* hi = static_cast<int>(d) == split ? end : i64(sizes[d]);
    loop(lo, hi, [&](llvm::Value* i) {
      idx[d] = i;
      level(d + 1);
    });
  };
  level(0);
}

llvm::Value* LoopEmitter::dot(const std::vector<llvm::Value*>& idx, const std::vector<int64_t>& strides,
                              llvm::Value* base) {
  llvm::Value* sum = base ? base : i64(0);
  for (size_t d = 0; d < idx.size(); ++d) {
    if (strides[d] == 0) continue;
    llvm::Value* term = strides[d] == 1 ? idx[d] : b.CreateMul(idx[d], i64(strides[d]), "", true, true);
    sum = b.CreateAdd(sum, term, "", true, true);
  }
  return sum;
}

namespace {

llvm::Type* storage_type(llvm::IRBuilder<>& b, ir::DType t) {
  switch (t) {
    case ir::DType::F64: return b.getDoubleTy();
    case ir::DType::F32: return b.getFloatTy();
    case ir::DType::F16: return b.getHalfTy();
    case ir::DType::BF16: return b.getInt16Ty();  // bits; converted by shifts (see round_to_bf16)
    case ir::DType::I32: return b.getInt32Ty();
    case ir::DType::I64: return b.getInt64Ty();
    case ir::DType::Bool:
    case ir::DType::F8E4M3:
    case ir::DType::F8E5M2: return b.getInt8Ty();
  }
  NAPKIN_INTERNAL_CHECK(false, "unknown dtype {}", static_cast<int>(t));
  return nullptr;
}

// float -> bf16 bits (i16), nearest even with subnormals, NaN -> S.11111111.1000000:
// the bits of runtime's float_to_bf16_bits. Not fptrunc: on AVX512_BF16
// LLVM lowers that to vcvtneps2bf16, which flushes subnormals to zero.
llvm::Value* round_to_bf16(llvm::IRBuilder<>& b, llvm::Value* x) {
  llvm::Type* i32 = b.getInt32Ty();
  auto c = [&](uint32_t v) { return b.getInt32(v); };
  llvm::Value* u = b.CreateBitCast(x, i32);
  llvm::Value* lsb = b.CreateAnd(b.CreateLShr(u, c(16)), c(1));
  llvm::Value* rounded = b.CreateLShr(b.CreateAdd(u, b.CreateAdd(c(0x7FFF), lsb)), c(16));
  llvm::Value* nan = b.CreateOr(b.CreateAnd(b.CreateLShr(u, c(16)), c(0x8000)), c(0x7FC0));
  llvm::Value* is_nan = b.CreateICmpUGT(b.CreateAnd(u, c(0x7FFFFFFF)), c(0x7F800000));
  return b.CreateTrunc(b.CreateSelect(is_nan, nan, rounded), b.getInt16Ty());
}

// An OCP 8-bit float format by its fields (as runtime/float_formats.cpp).
struct F8Format {
  int exponent_bits, mantissa_bits;
  bool finite_only;  // E4M3 "fn": no inf, only S.1111.111 is NaN
  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  int min_exponent() const { return 1 - bias(); }
  uint32_t all_ones() const { return 0x7F; }
  uint32_t exponent_ones() const { return ((1u << exponent_bits) - 1) << mantissa_bits; }
  uint32_t max_finite() const { return finite_only ? all_ones() - 1 : exponent_ones() - 1; }
  uint32_t overflow() const { return finite_only ? all_ones() : exponent_ones(); }  // NaN or inf
  uint32_t nan() const { return all_ones(); }  // S.1..1.1..1 in both formats (c10's converters)
};
constexpr F8Format kE4M3{4, 3, true};
constexpr F8Format kE5M2{5, 2, false};

// fp8 code (i8) -> float, exact; the bits of runtime's f8*_bits_to_float for
// every code (NaN payloads included). Selects, no branches, so it vectorizes.
llvm::Value* decode_f8(llvm::IRBuilder<>& b, const F8Format& f, llvm::Value* code8) {
  llvm::Type* i32 = b.getInt32Ty();
  auto c = [&](uint32_t v) { return b.getInt32(v); };
  llvm::Value* code = b.CreateZExt(code8, i32);
  llvm::Value* sign = b.CreateShl(b.CreateLShr(code, c(7)), c(31));
  llvm::Value* magnitude = b.CreateAnd(code, c(f.all_ones()));
  llvm::Value* exponent = b.CreateLShr(magnitude, c(uint32_t(f.mantissa_bits)));
  llvm::Value* mantissa = b.CreateAnd(magnitude, c((1u << f.mantissa_bits) - 1));
  llvm::Value* fraction = b.CreateShl(mantissa, c(uint32_t(23 - f.mantissa_bits)));
  // Normal: rebias the exponent into float32's field.
  llvm::Value* normal = b.CreateOr(b.CreateShl(b.CreateAdd(exponent, c(uint32_t(127 - f.bias()))), c(23)), fraction);
  // Subnormal: mantissa * 2^(min_exponent - mantissa_bits), a normal float32.
  llvm::Value* sub = b.CreateBitCast(
      b.CreateFMul(b.CreateUIToFP(mantissa, b.getFloatTy()),
                   llvm::ConstantFP::get(b.getFloatTy(), std::ldexp(1.0, f.min_exponent() - f.mantissa_bits))),
      i32);
  // Inf and NaN: float32's all-ones exponent with the payload on top of its fraction.
  llvm::Value* special_bits = b.CreateOr(c(0x7F800000), fraction);
  llvm::Value* special = f.finite_only ? b.CreateICmpEQ(magnitude, c(f.all_ones()))
                                       : b.CreateICmpUGE(magnitude, c(f.exponent_ones()));
  llvm::Value* bits = b.CreateSelect(b.CreateICmpEQ(exponent, c(0)), sub, normal);
  bits = b.CreateSelect(special, special_bits, bits);
  return b.CreateBitCast(b.CreateOr(sign, bits), b.getFloatTy());
}

// float -> fp8 code (i8), round to nearest even with subnormals; too large
// (inf included) -> inf (E5M2) or NaN (E4M3), NaN -> S.1..1.1..1: the bits of
// runtime's float_to_f8*_bits (non-saturating). The same arithmetic as
// float_formats.cpp's round_magnitude, branch-free.
llvm::Value* encode_f8(llvm::IRBuilder<>& b, const F8Format& f, llvm::Value* x) {
  llvm::Type* i32 = b.getInt32Ty();
  auto c = [&](uint32_t v) { return b.getInt32(v); };
  llvm::Value* u = b.CreateBitCast(x, i32);
  llvm::Value* sign = b.CreateShl(b.CreateLShr(u, c(31)), c(7));
  llvm::Value* magnitude = b.CreateAnd(u, c(0x7FFFFFFF));
  llvm::Value* biased = b.CreateLShr(magnitude, c(23));
  llvm::Value* is_normal = b.CreateICmpNE(biased, c(0));
  // value = significand * 2^(exponent - 23), exponent = max(biased, 1) - 127.
  llvm::Value* significand =
      b.CreateOr(b.CreateAnd(magnitude, c(0x007FFFFF)), b.CreateSelect(is_normal, c(1u << 23), c(0)));
  llvm::Value* exponent = b.CreateSub(b.CreateSelect(is_normal, biased, c(1)), c(127));
  llvm::Value* min_exp = c(uint32_t(f.min_exponent()));
  llvm::Value* target = b.CreateSelect(b.CreateICmpSGT(exponent, min_exp), exponent, min_exp);
  // shift >= 13; from 25 on the significand (< 2^24) is below half a step, and
  // 25 itself rounds it to 0, so clamping keeps the shifts in range.
  llvm::Value* shift = b.CreateAdd(b.CreateSub(target, exponent), c(uint32_t(23 - f.mantissa_bits)));
  shift = b.CreateSelect(b.CreateICmpULT(shift, c(25)), shift, c(25));
  llvm::Value* q = b.CreateLShr(significand, shift);
  llvm::Value* rest = b.CreateAnd(significand, b.CreateSub(b.CreateShl(c(1), shift), c(1)));
  llvm::Value* half = b.CreateShl(c(1), b.CreateSub(shift, c(1)));
  llvm::Value* up = b.CreateOr(b.CreateICmpUGT(rest, half),
                               b.CreateAnd(b.CreateICmpEQ(rest, half), b.CreateICmpNE(b.CreateAnd(q, c(1)), c(0))));
  q = b.CreateAdd(q, b.CreateZExt(up, i32));
  // A significand that rounds up to the next power of two carries into the
  // exponent field by itself (subnormal -> normal included).
  llvm::Value* code =
      b.CreateAdd(b.CreateShl(b.CreateSub(target, min_exp), c(uint32_t(f.mantissa_bits))), q);
  code = b.CreateSelect(b.CreateICmpUGT(code, c(f.max_finite())), c(f.overflow()), code);
  // inf -> overflow code; NaN -> the NaN code.
  code = b.CreateSelect(b.CreateICmpEQ(magnitude, c(0x7F800000)), c(f.overflow()), code);
  code = b.CreateSelect(b.CreateICmpUGT(magnitude, c(0x7F800000)), c(f.nan()), code);
  return b.CreateTrunc(b.CreateOr(sign, code), b.getInt8Ty());
}

}  // namespace

llvm::Value* LoopEmitter::element_ptr(const Operand& o, llvm::Value* index, llvm::Value* base) {
  if (base) return b.CreateInBoundsGEP(storage_type(b, o.dtype), base, index);
  int64_t first = 0, last = 0;  // elements from element 0
  for (size_t d = 0; d < o.sizes.size(); ++d) {
    const int64_t span = std::max<int64_t>(o.sizes[d] - 1, 0) * o.strides[d];
    (span < 0 ? first : last) += span;
  }
  const int64_t size = ir::dtype_size(o.dtype);
  const int64_t first_byte = o.byte_offset + first * size, end_byte = o.byte_offset + (last + 1) * size;
  auto slot = std::find_if(slots_.begin(), slots_.end(), [&](const Slot& s) { return s.offset == o.byte_offset; });
  if (slot == slots_.end()) {
    llvm::IRBuilder<> at_entry(entry_, entry_->begin());
    llvm::Value* offset = at_entry.CreateLoad(b.getInt64Ty(), at_entry.CreateConstInBoundsGEP1_64(b.getInt64Ty(), offsets_, slots_.size()));
    slots_.push_back({o.byte_offset, first_byte, end_byte, at_entry.CreateInBoundsGEP(b.getInt8Ty(), arena, offset)});
    slot = slots_.end() - 1;
  }
  slot->first_byte = std::min(slot->first_byte, first_byte);
  slot->end_byte = std::max(slot->end_byte, end_byte);
  return b.CreateInBoundsGEP(storage_type(b, o.dtype), slot->base, index);
}

std::vector<int64_t> LoopEmitter::slot_offsets() const {
  std::vector<int64_t> offsets;
  for (const Slot& s : slots_) offsets.push_back(s.offset);
  return offsets;
}

void LoopEmitter::mark_disjoint_slots() {
  // The metadata is quadratic in the slots: past kMaxMarkedSlots it costs O3
  // more than it can give. Such kernels are the optimizer's sums of one
  // scalar per parameter (GPT-2 XL: 580), straight-line code with no loop
  // to vectorize (O3 of GPT-2 XL 0.93 -> 0.26 s).
  if (slots_.size() > kMaxMarkedSlots) return;
  llvm::MDBuilder md(ctx);
  llvm::MDNode* domain = md.createAnonymousAliasScopeDomain("operands");
  std::vector<llvm::Metadata*> scopes;  // of the disjoint slots
  std::map<llvm::Value*, llvm::MDNode*> scope_of;  // slot base -> its scope, null where it meets another slot
  for (const Slot& s : slots_) {
    const bool disjoint = std::all_of(slots_.begin(), slots_.end(), [&](const Slot& t) {
      return &t == &s || s.end_byte <= t.first_byte || t.end_byte <= s.first_byte;
    });
    scope_of[s.base] = disjoint ? md.createAnonymousAliasScope(domain) : nullptr;
    if (disjoint) scopes.push_back(scope_of[s.base]);
  }
  for (llvm::BasicBlock& block : *fn)
    for (llvm::Instruction& access : block) {
      llvm::Value* ptr = llvm::getLoadStorePointerOperand(&access);
      while (ptr && !scope_of.count(ptr)) {  // element_ptr's GEPs down to the slot's base
        auto* gep = llvm::dyn_cast<llvm::GetElementPtrInst>(ptr);
        ptr = gep ? gep->getPointerOperand() : nullptr;
      }
      if (!ptr) continue;  // not an operand (a partials buffer, an accumulator)
      llvm::MDNode* own = scope_of[ptr];
      std::vector<llvm::Metadata*> others;
      for (llvm::Metadata* scope : scopes)
        if (scope != own) others.push_back(scope);
      if (own) access.setMetadata(llvm::LLVMContext::MD_alias_scope, llvm::MDNode::get(ctx, {own}));
      if (!others.empty()) access.setMetadata(llvm::LLVMContext::MD_noalias, llvm::MDNode::get(ctx, others));
    }
}

llvm::Value* LoopEmitter::from_storage(llvm::Value* v, ir::DType t) {
  switch (t) {
    case ir::DType::F16: return b.CreateFPExt(v, b.getFloatTy());
    case ir::DType::BF16:  // the top half of a float32
      return b.CreateBitCast(b.CreateShl(b.CreateZExt(v, b.getInt32Ty()), b.getInt32(16)), b.getFloatTy());
    case ir::DType::Bool: return b.CreateICmpNE(v, b.getInt8(0));
    case ir::DType::F8E4M3: return decode_f8(b, kE4M3, v);
    case ir::DType::F8E5M2: return decode_f8(b, kE5M2, v);
    default: return v;
  }
}

llvm::Value* LoopEmitter::to_storage(llvm::Value* v, ir::DType t) {
  switch (t) {
    case ir::DType::F16: return b.CreateFPTrunc(v, b.getHalfTy());
    case ir::DType::BF16: return round_to_bf16(b, v);
    case ir::DType::Bool: return b.CreateZExt(v, b.getInt8Ty());
    case ir::DType::F8E4M3: return encode_f8(b, kE4M3, v);
    case ir::DType::F8E5M2: return encode_f8(b, kE5M2, v);
    default: return v;
  }
}

llvm::Value* LoopEmitter::load(const Operand& o, llvm::Value* index, llvm::Value* base) {
  return from_storage(b.CreateLoad(storage_type(b, o.dtype), element_ptr(o, index, base)), o.dtype);
}

void LoopEmitter::store(const Operand& o, llvm::Value* index, llvm::Value* v, llvm::Value* base) {
  b.CreateStore(to_storage(v, o.dtype), element_ptr(o, index, base));
}

llvm::Value* LoopEmitter::as_stored(llvm::Value* v, ir::DType t) {
  switch (t) {
    case ir::DType::F16:
    case ir::DType::BF16:
    case ir::DType::F8E4M3:
    case ir::DType::F8E5M2: return from_storage(to_storage(v, t), t);
    default: return v;  // the compute type holds the dtype's values exactly
  }
}

llvm::Value* LoopEmitter::convert(llvm::Value* v, ir::DType from, ir::DType to) {
  llvm::Type* src = compute_type(from);
  llvm::Type* dst = compute_type(to);
  if (src == dst) return v;
  if (dst->isIntegerTy(1)) {
    if (src->isFloatingPointTy()) return b.CreateFCmpUNE(v, llvm::ConstantFP::get(src, 0.0));
    return b.CreateICmpNE(v, llvm::ConstantInt::get(src, 0));
  }
  if (src->isIntegerTy(1)) {
    if (dst->isFloatingPointTy()) return b.CreateUIToFP(v, dst);
    return b.CreateZExt(v, dst);
  }
  if (src->isFloatingPointTy() && dst->isFloatingPointTy()) return b.CreateFPCast(v, dst);
  if (src->isIntegerTy() && dst->isFloatingPointTy()) return b.CreateSIToFP(v, dst);
  if (src->isIntegerTy() && dst->isIntegerTy()) return b.CreateSExtOrTrunc(v, dst);
  // float -> int: toward zero, saturating, NaN -> 0 (as interp/rounding.cpp).
  return b.CreateIntrinsic(llvm::Intrinsic::fptosi_sat, {dst, src}, {v});
}

llvm::Value* LoopEmitter::make_slot(llvm::Type* t, llvm::Value* init) {
  llvm::IRBuilder<> at_entry(entry_, entry_->begin());
  llvm::Value* slot = at_entry.CreateAlloca(t);
  b.CreateStore(init, slot);
  return slot;
}

llvm::Value* LoopEmitter::add_reassoc(llvm::Value* x, llvm::Value* y) {
  if (!x->getType()->isFloatingPointTy()) return b.CreateAdd(x, y);
  llvm::Value* s = b.CreateFAdd(x, y);
  if (auto* inst = llvm::dyn_cast<llvm::Instruction>(s)) inst->setHasAllowReassoc(true);
  return s;
}

void LoopEmitter::check_index(llvm::Value* id, int64_t bound, int kernel_index) {
  llvm::Value* id64 = b.CreateSExtOrTrunc(id, b.getInt64Ty());
  // One unsigned compare covers id < 0 and id >= bound.
  llvm::Value* bad = b.CreateICmpUGE(id64, i64(bound));
  llvm::BasicBlock* fail = llvm::BasicBlock::Create(ctx, "bad.index", fn);
  llvm::BasicBlock* ok = llvm::BasicBlock::Create(ctx, "index.ok", fn);
  b.CreateCondBr(bad, fail, ok);
  b.SetInsertPoint(fail);
  llvm::FunctionCallee hook = module.getOrInsertFunction(
      "napkin_rt_bad_index", llvm::FunctionType::get(b.getVoidTy(), {b.getInt64Ty(), b.getInt64Ty(), b.getInt64Ty()}, false));
  b.CreateCall(hook, {i64(kernel_index), id64, i64(bound)});
  b.CreateUnreachable();
  b.SetInsertPoint(ok);
}

}  // namespace napkin::codegen::cpu
