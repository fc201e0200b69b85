#include "codegen/cpu/scalar_ops.h"

#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

#include <array>
#include <cmath>
#include <limits>

#include "ir/internal_check.h"
#include "ir/rng.h"
#include "runtime/rng.h"

namespace napkin::codegen::cpu {

namespace {

using ir::Op;

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

llvm::Value* gelu(LoopEmitter& e, llvm::Value* x, bool tanh_form) {
  auto& b = e.b;
  if (tanh_form) {
    // 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi)
    llvm::Value* x3 = b.CreateFMul(b.CreateFMul(x, x), x);
    llvm::Value* inner = b.CreateFMul(fconst(x, std::sqrt(2.0 / M_PI)), b.CreateFAdd(x, b.CreateFMul(fconst(x, 0.044715), x3)));
    return b.CreateFMul(b.CreateFMul(fconst(x, 0.5), x), b.CreateFAdd(fconst(x, 1.0), emit_tanh(e, inner)));
  }
  // 0.5 x (1 + erf(x / sqrt 2))
  llvm::Value* erf = libm_call(e, "erff", "erf", b.CreateFMul(x, fconst(x, M_SQRT1_2)));
  return b.CreateFMul(b.CreateFMul(fconst(x, 0.5), x), b.CreateFAdd(fconst(x, 1.0), erf));
}

llvm::Value* gelu_derivative(LoopEmitter& e, llvm::Value* x, bool tanh_form) {
  auto& b = e.b;
  if (tanh_form) {
    // 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2)
    const double c = std::sqrt(2.0 / M_PI);
    llvm::Value* x2 = b.CreateFMul(x, x);
    llvm::Value* inner = b.CreateFMul(fconst(x, c), b.CreateFAdd(x, b.CreateFMul(fconst(x, 0.044715), b.CreateFMul(x2, x))));
    llvm::Value* t = emit_tanh(e, inner);
    llvm::Value* left = b.CreateFMul(fconst(x, 0.5), b.CreateFAdd(fconst(x, 1.0), t));
    llvm::Value* sech2 = b.CreateFSub(fconst(x, 1.0), b.CreateFMul(t, t));
    llvm::Value* slope = b.CreateFMul(fconst(x, c), b.CreateFAdd(fconst(x, 1.0), b.CreateFMul(fconst(x, 3 * 0.044715), x2)));
    return b.CreateFAdd(left, b.CreateFMul(b.CreateFMul(b.CreateFMul(fconst(x, 0.5), x), sech2), slope));
  }
  // Phi(x) + x phi(x)
  llvm::Value* cdf = b.CreateFMul(fconst(x, 0.5),
                                  b.CreateFAdd(fconst(x, 1.0), libm_call(e, "erff", "erf", b.CreateFMul(x, fconst(x, M_SQRT1_2)))));
  llvm::Value* pdf = b.CreateFMul(emit_exp(e, b.CreateFMul(fconst(x, -0.5), b.CreateFMul(x, x))), fconst(x, 1.0 / std::sqrt(2.0 * M_PI)));
  return b.CreateFAdd(cdf, b.CreateFMul(x, pdf));
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

// ir/rng.h's dropout: args are x and the rng words (i64), `flat` the element's index.
llvm::Value* dropout(LoopEmitter& e, const ir::Attrs& attrs, ir::DType dtype, const std::vector<llvm::Value*>& args,
                     llvm::Value* flat) {
  auto& b = e.b;
  llvm::Type* i32 = b.getInt32Ty();
  llvm::Value* x = args[0];
  auto word = [&](int64_t w) { return args[1 + w]; };
  llvm::Value* step = word(ir::kRngStep);
  llvm::Value* r = philox_word0(
      e,
      {b.CreateTrunc(flat, i32), b.getInt32(static_cast<uint32_t>(attrs.get_int("stream"))), b.CreateTrunc(step, i32),
       b.CreateTrunc(b.CreateLShr(step, 32), i32)},
      {b.CreateTrunc(word(ir::kRngSeedLow), i32), b.CreateTrunc(word(ir::kRngSeedHigh), i32)});
  double p = attrs.get_double("p");
  llvm::Value* keep = b.CreateICmpUGE(r, b.getInt32(ir::dropout_threshold(p)));
  llvm::Value* kept = b.CreateSelect(keep, b.CreateFMul(x, fconst(x, ir::dropout_scale(p, dtype))), fconst(x, 0.0));
  llvm::Value* training = b.CreateICmpNE(word(ir::kRngTraining), b.getInt64(0));
  return b.CreateSelect(training, kept, x);
}

llvm::Value* binary(LoopEmitter& e, Op op, llvm::Value* x, llvm::Value* y) {
  auto& b = e.b;
  bool fp = x->getType()->isFloatingPointTy();
  switch (op) {
    case Op::Add: return fp ? b.CreateFAdd(x, y) : b.CreateAdd(x, y);
    case Op::Sub: return fp ? b.CreateFSub(x, y) : b.CreateSub(x, y);
    case Op::Mul: return fp ? b.CreateFMul(x, y) : b.CreateMul(x, y);
    case Op::Div: return fp ? b.CreateFDiv(x, y) : b.CreateSDiv(x, y);
    case Op::Pow:
      if (fp) return b.CreateBinaryIntrinsic(llvm::Intrinsic::pow, x, y);
      break;
    case Op::Maximum: return b.CreateBinaryIntrinsic(fp ? llvm::Intrinsic::maximum : llvm::Intrinsic::smax, x, y);
    case Op::Minimum: return b.CreateBinaryIntrinsic(fp ? llvm::Intrinsic::minimum : llvm::Intrinsic::smin, x, y);
    case Op::Less: return fp ? b.CreateFCmpOLT(x, y) : b.CreateICmpSLT(x, y);
    case Op::LessEqual: return fp ? b.CreateFCmpOLE(x, y) : b.CreateICmpSLE(x, y);
    case Op::Greater: return fp ? b.CreateFCmpOGT(x, y) : b.CreateICmpSGT(x, y);
    case Op::GreaterEqual: return fp ? b.CreateFCmpOGE(x, y) : b.CreateICmpSGE(x, y);
    case Op::Equal: return fp ? b.CreateFCmpOEQ(x, y) : b.CreateICmpEQ(x, y);
    case Op::NotEqual: return fp ? b.CreateFCmpUNE(x, y) : b.CreateICmpNE(x, y);
    default: break;
  }
  NAPKIN_INTERNAL_CHECK(false, "no CPU lowering of this binary op for its dtype");
  return nullptr;
}

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
  auto& b = e.b;
  llvm::Value* x = args.empty() ? nullptr : args[0];
  bool fp = x && x->getType()->isFloatingPointTy();
  switch (op) {
    case Op::Neg: return fp ? b.CreateFNeg(x) : b.CreateNeg(x);
    case Op::Exp: return emit_exp(e, x);
    case Op::Log: return emit_log(e, x);
    case Op::Sqrt: return unary_intrinsic(e, llvm::Intrinsic::sqrt, x);
    case Op::Rsqrt: return b.CreateFDiv(fconst(x, 1.0), unary_intrinsic(e, llvm::Intrinsic::sqrt, x));
    case Op::Abs: return fp ? unary_intrinsic(e, llvm::Intrinsic::fabs, x) : b.CreateBinaryIntrinsic(llvm::Intrinsic::abs, x, b.getFalse());
    case Op::Tanh: return emit_tanh(e, x);
    case Op::Relu:
      if (fp) return b.CreateSelect(b.CreateFCmpOLT(x, fconst(x, 0.0)), fconst(x, 0.0), x);
      return b.CreateBinaryIntrinsic(llvm::Intrinsic::smax, x, llvm::ConstantInt::get(x->getType(), 0));
    case Op::Gelu: return gelu(e, x, attrs.get_string("approximate") == "tanh");
    case Op::Sigmoid: return b.CreateFDiv(fconst(x, 1.0), b.CreateFAdd(fconst(x, 1.0), emit_exp(e, b.CreateFNeg(x))));
    case Op::Silu: return b.CreateFDiv(x, b.CreateFAdd(fconst(x, 1.0), emit_exp(e, b.CreateFNeg(x))));
    case Op::Sin: return unary_intrinsic(e, llvm::Intrinsic::sin, x);
    case Op::Cos: return unary_intrinsic(e, llvm::Intrinsic::cos, x);
    case Op::Cast: return e.convert(x, from, to);
    case Op::Triu: {
      llvm::Value* keep = b.CreateICmpSGE(b.CreateSub(at.col, at.row), e.i64(attrs.get_int("k")));
      return b.CreateSelect(keep, x, e.constant(from, 0));
    }
    case Op::CausalMask:
      return b.CreateSelect(b.CreateICmpSGT(at.col, at.row), fconst(x, -std::numeric_limits<double>::infinity()), x);
    case Op::Dropout: return dropout(e, attrs, from, args, at.flat);
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::Pow:
    case Op::Maximum:
    case Op::Minimum:
    case Op::Less:
    case Op::LessEqual:
    case Op::Greater:
    case Op::GreaterEqual:
    case Op::Equal:
    case Op::NotEqual: return binary(e, op, args[0], args[1]);
    case Op::Where: return b.CreateSelect(args[0], args[1], args[2]);
    case Op::GeluGrad: return b.CreateFMul(gelu_derivative(e, args[0], attrs.get_string("approximate") == "tanh"), args[1]);
    case Op::Copy: return x;
    default: break;
  }
  NAPKIN_INTERNAL_CHECK(false, "not an elementwise op");
  return nullptr;
}

}  // namespace napkin::codegen::cpu
