// emit_cuda_source: the translation unit of a plan's Loop kernels: the
// prelude, then each kernel's functions in plan order. Which emitter makes
// which op's kernel is the switch below (no default: -Werror=switch flags a
// new op); the launch and scratch design of each family is described at the
// top of its file (elementwise.cpp, reductions.cpp, rows.cpp).
//
// Index ids out of range (embedding, embedding_grad, cross-entropy targets):
// the CPU backend calls napkin_rt_bad_index and exits. A CUDA kernel records
// the first such id instead, through NAPKIN_BAD_INDEX(kernel index, id, bound),
// into the device global `long long napkin_bad_index[3]` = {kernel, id, bound}
// (element 0 is -1 until then; the first writer wins by atomicCAS), and skips
// the element (writes nothing for it; a cross-entropy row counts 0). The
// runtime reads the global with cuModuleGetGlobal after the step and reports
// it as the CPU does (see the prelude, codegen/cuda/prelude.cpp).
#include "codegen/cuda/kernel_source.h"

#include <fmt/format.h>

#include <algorithm>

#include "codegen/cuda/emit.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cuda {

namespace {

using detail::EmittedKernel;
using ir::Op;

EmittedKernel emit_kernel(const Kernel& k, int index) {
  if (k.fused) return detail::emit_elementwise(k);
  switch (k.op) {
    case Op::Constant:
    case Op::Iota: return detail::emit_source_op(k);
    case Op::Neg:
    case Op::Exp:
    case Op::Log:
    case Op::Sqrt:
    case Op::Rsqrt:
    case Op::Abs:
    case Op::Tanh:
    case Op::Relu:
    case Op::Gelu:
    case Op::Sigmoid:
    case Op::Silu:
    case Op::Sin:
    case Op::Cos:
    case Op::Cast:
    case Op::Triu:
    case Op::CausalMask:
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
    case Op::NotEqual:
    case Op::Where:
    case Op::GeluGrad:
    case Op::Copy: return detail::emit_elementwise(k);
    case Op::ReduceSum:
    case Op::ReduceMean:
    case Op::ReduceMax:
    case Op::ReduceMin: return detail::emit_reduction(k);
    case Op::MatMul:
    case Op::Einsum: return detail::emit_contraction(k);
    case Op::Concat:
    case Op::Pad: return detail::emit_concat_or_pad(k);
    case Op::Embedding: return detail::emit_embedding(k, index);
    case Op::EmbeddingGrad: return detail::emit_embedding_grad(k, index);
    case Op::Softmax:
    case Op::LogSoftmax:
    case Op::SoftmaxGrad:
    case Op::LayerNorm:
    case Op::RMSNorm:
    case Op::LayerNormGrad:
    case Op::RMSNormGrad:
    case Op::NormGainGrad:
    case Op::CrossEntropy:
    case Op::CrossEntropyGrad: return detail::emit_rows(k, index);
    case Op::MSE: return detail::emit_mse(k);
    case Op::Reshape:
    case Op::Permute:
    case Op::Broadcast:
    case Op::Slice:
    case Op::Select: break;
  }
  NAPKIN_INTERNAL_CHECK(false, "views have no kernel ({})", k.name);
  return {};
}

}  // namespace

CudaSource emit_cuda_source(const KernelPlan& plan, const std::string& model_name) {
  CudaSource src;
  src.text = fmt::format("// napkin: CUDA kernels of model {} ({} plan kernels)\n", model_name, plan.kernels.size());
  src.text += cuda_prelude();
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const Kernel& k = plan.kernels[i];
    if (k.kind == KernelKind::Matmul) {
      src.launches.emplace_back();
      continue;
    }
    EmittedKernel e = emit_kernel(k, static_cast<int>(i));
    src.text += fmt::format("\n// {}: {}{}\n", k.name, ir::op_name(k.op), k.where.empty() ? "" : " at " + k.where);
    src.text += e.text;
    src.launches.push_back(std::move(e.launches));
    src.scratch_bytes = std::max(src.scratch_bytes, e.scratch_bytes);
  }
  return src;
}

}  // namespace napkin::codegen::cuda
