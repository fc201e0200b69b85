#include "codegen/cpu/scalar_ops.h"

#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

#include <array>

#include "ir/elementwise_formulas.h"
#include "ir/internal_check.h"
#include "runtime/rng.h"

namespace napkin::codegen::cpu {

namespace {

llvm::Value* fconst(llvm::Value* like, double v) { return llvm::ConstantFP::get(like->getType(), v); }

llvm::Value* unary_intrinsic(LoopEmitter& e, llvm::Intrinsic::ID id, llvm::Value* x) {
  return e.b.CreateUnaryIntrinsic(id, x);
}

// A libm function of one argument (erf has no LLVM intrinsic).
llvm::Value* libm_call(LoopEmitter& e, const char* f32_name, const char* f64_name, llvm::Value* x) {
  bool is_f32 = x->getType()->isFloatTy();
  llvm::FunctionCallee f = e.module.getOrInsertFunction(is_f32 ? f32_name : f64_name,
                                                        llvm::FunctionType::get(x->getType(), {x->getType()}, false));
  return e.b.CreateCall(f, {x});
}

// Word 0 of runtime::philox4x32_10(c, k) on i32 values: the same rounds, each
// 32x32 -> 64-bit product split into its high and low words.
llvm::Value* philox_word0(LoopEmitter& e, std::array<llvm::Value*, 4> c, std::array<llvm::Value*, 2> k) {
  auto& b = e.b;
  llvm::Type* i32 = b.getInt32Ty();
  auto mulhilo = [&](uint32_t m, llvm::Value* x, llvm::Value*& hi, llvm::Value*& lo) {
    llvm::Value* p = b.CreateMul(b.CreateZExt(x, b.getInt64Ty()), b.getInt64(m));
    hi = b.CreateTrunc(b.CreateLShr(p, 32), i32);
    lo = b.CreateTrunc(p, i32);
  };
  for (int round = 0; round < runtime::kPhiloxRounds; ++round) {
    if (round > 0) {
      k[0] = b.CreateAdd(k[0], b.getInt32(runtime::kPhiloxWeyl0));
      k[1] = b.CreateAdd(k[1], b.getInt32(runtime::kPhiloxWeyl1));
    }
    llvm::Value *hi0, *lo0, *hi1, *lo1;
    mulhilo(runtime::kPhiloxMul0, c[0], hi0, lo0);
    mulhilo(runtime::kPhiloxMul1, c[2], hi1, lo1);
    c = {b.CreateXor(b.CreateXor(hi1, c[1]), k[0]), lo1, b.CreateXor(b.CreateXor(hi0, c[3]), k[1]), lo0};
  }
  return c[0];
}

// LLVM IR for ir/elementwise_formulas.h: each primitive one instruction, an
// intrinsic or a libm call, on the compute values of loop_emitter.h.
class LlvmArithmetic {
 public:
  using Handle = llvm::Value*;
  explicit LlvmArithmetic(LoopEmitter& e) : e_(e), b_(e.b) {}

  Handle constant(Handle like, double v) const {
    if (fp(like)) return fconst(like, v);
    return llvm::ConstantInt::get(like->getType(), static_cast<uint64_t>(static_cast<int64_t>(v)), true);
  }
  Handle add(Handle x, Handle y) const { return fp(x) ? b_.CreateFAdd(x, y) : b_.CreateAdd(x, y); }
  Handle sub(Handle x, Handle y) const { return fp(x) ? b_.CreateFSub(x, y) : b_.CreateSub(x, y); }
  Handle mul(Handle x, Handle y) const { return fp(x) ? b_.CreateFMul(x, y) : b_.CreateMul(x, y); }
  Handle div(Handle x, Handle y) const { return fp(x) ? b_.CreateFDiv(x, y) : b_.CreateSDiv(x, y); }
  Handle neg(Handle x) const { return fp(x) ? b_.CreateFNeg(x) : b_.CreateNeg(x); }
  Handle less(Handle x, Handle y) const { return fp(x) ? b_.CreateFCmpOLT(x, y) : b_.CreateICmpSLT(x, y); }
  Handle less_equal(Handle x, Handle y) const { return fp(x) ? b_.CreateFCmpOLE(x, y) : b_.CreateICmpSLE(x, y); }
  Handle greater(Handle x, Handle y) const { return fp(x) ? b_.CreateFCmpOGT(x, y) : b_.CreateICmpSGT(x, y); }
  Handle greater_equal(Handle x, Handle y) const { return fp(x) ? b_.CreateFCmpOGE(x, y) : b_.CreateICmpSGE(x, y); }
  Handle equal(Handle x, Handle y) const { return fp(x) ? b_.CreateFCmpOEQ(x, y) : b_.CreateICmpEQ(x, y); }
  // Unordered: NaN != NaN, as in C.
  Handle not_equal(Handle x, Handle y) const { return fp(x) ? b_.CreateFCmpUNE(x, y) : b_.CreateICmpNE(x, y); }
  Handle select(Handle cond, Handle x, Handle y) const { return b_.CreateSelect(cond, x, y); }
  Handle exp(Handle x) const { return emit_exp(e_, x); }
  Handle log(Handle x) const { return emit_log(e_, x); }
  Handle tanh(Handle x) const { return emit_tanh(e_, x); }
  Handle erf(Handle x) const { return libm_call(e_, "erff", "erf", x); }
  Handle sqrt(Handle x) const { return unary_intrinsic(e_, llvm::Intrinsic::sqrt, x); }
  Handle sin(Handle x) const { return unary_intrinsic(e_, llvm::Intrinsic::sin, x); }
  Handle cos(Handle x) const { return unary_intrinsic(e_, llvm::Intrinsic::cos, x); }
  Handle abs(Handle x) const {
    return fp(x) ? unary_intrinsic(e_, llvm::Intrinsic::fabs, x) : b_.CreateBinaryIntrinsic(llvm::Intrinsic::abs, x, b_.getFalse());
  }
  Handle pow(Handle x, Handle y) const {
    NAPKIN_INTERNAL_CHECK(fp(x), "no CPU lowering of pow of integers");
    return b_.CreateBinaryIntrinsic(llvm::Intrinsic::pow, x, y);
  }
  Handle maximum(Handle x, Handle y) const {
    return b_.CreateBinaryIntrinsic(fp(x) ? llvm::Intrinsic::maximum : llvm::Intrinsic::smax, x, y);
  }
  Handle minimum(Handle x, Handle y) const {
    return b_.CreateBinaryIntrinsic(fp(x) ? llvm::Intrinsic::minimum : llvm::Intrinsic::smin, x, y);
  }
  Handle convert(Handle x, ir::DType from, ir::DType to) const { return e_.convert(x, from, to); }
  // The rng words and `flat` are i64.
  Handle dropout_keep(Handle flat, uint32_t stream, Handle seed_lo, Handle seed_hi, Handle step, uint32_t threshold) const {
    llvm::Type* i32 = b_.getInt32Ty();
    llvm::Value* r = philox_word0(
        e_, {b_.CreateTrunc(flat, i32), b_.getInt32(stream), b_.CreateTrunc(step, i32), b_.CreateTrunc(b_.CreateLShr(step, 32), i32)},
        {b_.CreateTrunc(seed_lo, i32), b_.CreateTrunc(seed_hi, i32)});
    return b_.CreateICmpUGE(r, b_.getInt32(threshold));
  }

 private:
  static bool fp(Handle x) { return x->getType()->isFloatingPointTy(); }
  LoopEmitter& e_;
  llvm::IRBuilder<>& b_;
};

}  // namespace

llvm::Value* emit_exp(LoopEmitter& e, llvm::Value* x) { return unary_intrinsic(e, llvm::Intrinsic::exp, x); }
llvm::Value* emit_log(LoopEmitter& e, llvm::Value* x) { return unary_intrinsic(e, llvm::Intrinsic::log, x); }

// tanh(x) = sign(x) (1 - 2 / (exp(2|x|) + 1)), which vectorizes through exp;
// near 0 that cancels, so |x| < 2^-4 uses x (1 - x^2/3 + 2x^4/15) instead
// (truncation error below 2e-10 relative there). exp overflowing to inf gives
// exactly +-1.
llvm::Value* emit_tanh(LoopEmitter& e, llvm::Value* x) {
  auto& b = e.b;
  llvm::Value* ax = unary_intrinsic(e, llvm::Intrinsic::fabs, x);
  llvm::Value* big = b.CreateFSub(fconst(x, 1.0), b.CreateFDiv(fconst(x, 2.0), b.CreateFAdd(emit_exp(e, b.CreateFMul(fconst(x, 2.0), ax)), fconst(x, 1.0))));
  big = b.CreateBinaryIntrinsic(llvm::Intrinsic::copysign, big, x);
  llvm::Value* x2 = b.CreateFMul(x, x);
  llvm::Value* poly = b.CreateFAdd(fconst(x, -1.0 / 3.0), b.CreateFMul(x2, fconst(x, 2.0 / 15.0)));
  llvm::Value* small = b.CreateFMul(x, b.CreateFAdd(fconst(x, 1.0), b.CreateFMul(x2, poly)));
  return b.CreateSelect(b.CreateFCmpOLT(ax, fconst(x, 0.0625)), small, big);
}

llvm::Value* emit_elementwise(LoopEmitter& e, ir::Op op, const ir::Attrs& attrs, ir::DType from, ir::DType to,
                              const std::vector<llvm::Value*>& args, const ElementAt& at) {
  LlvmArithmetic arith(e);
  using Value = ir::formulas::Value<LlvmArithmetic>;
  std::vector<Value> values;
  for (llvm::Value* a : args) values.emplace_back(arith, a);
  ir::formulas::Position<LlvmArithmetic> position{Value(arith, at.row), Value(arith, at.col), Value(arith, at.flat)};
  return ir::formulas::apply_elementwise(op, attrs, from, to, values, position).handle();
}

}  // namespace napkin::codegen::cpu
