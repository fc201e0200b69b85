#include "codegen/cpu/loop_emitter.h"

#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

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
}

llvm::Type* LoopEmitter::compute_type(ir::DType t) {
  switch (t) {
    case ir::DType::F64: return b.getDoubleTy();
    case ir::DType::F32:
    case ir::DType::F16:
    case ir::DType::BF16: return b.getFloatTy();
    case ir::DType::I32: return b.getInt32Ty();
    case ir::DType::I64: return b.getInt64Ty();
    case ir::DType::Bool: return b.getInt1Ty();
    case ir::DType::F8E4M3:
    case ir::DType::F8E5M2: break;
  }
  NAPKIN_INTERNAL_CHECK(false, "the CPU backend has no fp8 arithmetic (fp8 models run on the CUDA backend)");
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
    case ir::DType::BF16: return b.getBFloatTy();
    case ir::DType::I32: return b.getInt32Ty();
    case ir::DType::I64: return b.getInt64Ty();
    case ir::DType::Bool: return b.getInt8Ty();
    case ir::DType::F8E4M3:
    case ir::DType::F8E5M2: break;
  }
  NAPKIN_INTERNAL_CHECK(false, "the CPU backend has no fp8 storage");
  return nullptr;
}

}  // namespace

llvm::Value* LoopEmitter::element_ptr(const Operand& o, llvm::Value* index) {
  llvm::Value* base = b.CreateInBoundsGEP(b.getInt8Ty(), arena, i64(o.byte_offset));
  return b.CreateInBoundsGEP(storage_type(b, o.dtype), base, index);
}

llvm::Value* LoopEmitter::load(const Operand& o, llvm::Value* index) {
  llvm::Type* st = storage_type(b, o.dtype);
  llvm::Value* v = b.CreateLoad(st, element_ptr(o, index));
  switch (o.dtype) {
    case ir::DType::F16:
    case ir::DType::BF16: return b.CreateFPExt(v, b.getFloatTy());
    case ir::DType::Bool: return b.CreateICmpNE(v, b.getInt8(0));
    default: return v;
  }
}

void LoopEmitter::store(const Operand& o, llvm::Value* index, llvm::Value* v) {
  switch (o.dtype) {
    case ir::DType::F16: v = b.CreateFPTrunc(v, b.getHalfTy()); break;
    case ir::DType::BF16: v = b.CreateFPTrunc(v, b.getBFloatTy()); break;
    case ir::DType::Bool: v = b.CreateZExt(v, b.getInt8Ty()); break;
    default: break;
  }
  b.CreateStore(v, element_ptr(o, index));
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
