#include "codegen/cpu/scalar_ops.h"

#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

#include <cmath>
#include <limits>

#include "ir/internal_check.h"

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
                              const std::vector<llvm::Value*>& args, llvm::Value* row, llvm::Value* col) {
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
      llvm::Value* keep = b.CreateICmpSGE(b.CreateSub(col, row), e.i64(attrs.get_int("k")));
      return b.CreateSelect(keep, x, e.constant(from, 0));
    }
    case Op::CausalMask:
      return b.CreateSelect(b.CreateICmpSGT(col, row), fconst(x, -std::numeric_limits<double>::infinity()), x);
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
