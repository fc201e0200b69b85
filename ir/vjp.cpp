#include "ir/vjp.h"

#include "ir/builder.h"

namespace napkin::ir {

VjpFn vjp_rule(Op op) {
  switch (op) {
    case Op::Constant: return nullptr;
    case Op::Iota: return nullptr;
    case Op::Neg: return nullptr;
    case Op::Exp: return nullptr;
    case Op::Log: return nullptr;
    case Op::Sqrt: return nullptr;
    case Op::Rsqrt: return nullptr;
    case Op::Abs: return nullptr;
    case Op::Tanh: return nullptr;
    case Op::Relu: return nullptr;
    case Op::Gelu: return nullptr;
    case Op::Sigmoid: return nullptr;
    case Op::Silu: return nullptr;
    case Op::Sin: return nullptr;
    case Op::Cos: return nullptr;
    case Op::Cast: return nullptr;
    case Op::Triu: return nullptr;
    case Op::CausalMask: return nullptr;
    case Op::Add: return nullptr;
    case Op::Sub: return nullptr;
    case Op::Mul: return nullptr;
    case Op::Div: return nullptr;
    case Op::Pow: return nullptr;
    case Op::Maximum: return nullptr;
    case Op::Minimum: return nullptr;
    case Op::Less: return nullptr;
    case Op::LessEqual: return nullptr;
    case Op::Greater: return nullptr;
    case Op::GreaterEqual: return nullptr;
    case Op::Equal: return nullptr;
    case Op::NotEqual: return nullptr;
    case Op::Where: return nullptr;
    case Op::ReduceSum: return nullptr;
    case Op::ReduceMean: return nullptr;
    case Op::ReduceMax: return nullptr;
    case Op::ReduceMin: return nullptr;
    case Op::MatMul: return nullptr;
    case Op::Einsum: return nullptr;
    case Op::Reshape: return nullptr;
    case Op::Permute: return nullptr;
    case Op::Broadcast: return nullptr;
    case Op::Slice: return nullptr;
    case Op::Select: return nullptr;
    case Op::Copy: return nullptr;
    case Op::Concat: return nullptr;
    case Op::Embedding: return nullptr;
    case Op::Pad: return nullptr;
    case Op::Softmax: return nullptr;
    case Op::LogSoftmax: return nullptr;
    case Op::LayerNorm: return nullptr;
    case Op::RMSNorm: return nullptr;
    case Op::CrossEntropy: return nullptr;
    case Op::MSE: return nullptr;
    case Op::SoftmaxGrad: return nullptr;
    case Op::LayerNormGrad: return nullptr;
    case Op::RMSNormGrad: return nullptr;
    case Op::NormGainGrad: return nullptr;
    case Op::GeluGrad: return nullptr;
    case Op::CrossEntropyGrad: return nullptr;
    case Op::EmbeddingGrad: return nullptr;
  }
  return nullptr;
}

}  // namespace napkin::ir
