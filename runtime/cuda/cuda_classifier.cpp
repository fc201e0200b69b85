#include "runtime/cuda/cuda_classifier.h"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/error.h"
#include "runtime/gemm.h"

namespace napkin::runtime::cuda {

namespace {

MatmulSpec spec(DType a, DType b, DType c, MatmulDesc desc) {
  MatmulSpec s;
  s.a_dtype = a, s.b_dtype = b, s.c_dtype = c;
  s.desc = std::move(desc);
  return s;
}

}  // namespace

ClassifierGemms classifier_gemms(const KernelSpec& kernel) {
  const ClassifierSpec& k = std::get<ClassifierSpec>(kernel.payload);
  const ClassifierDesc& d = k.desc;
  const ClassifierSpec::Cuda l = k.cuda.value_or(ClassifierSpec::Cuda{});
  const DType t = k.dtype;
  int64_t es = 0;
  try {
    es = static_cast<int64_t>(gemm_type_bytes(gemm_type(t)));
  } catch (const Error&) {  // gemm_type names the f32, f64, bf16 and f16 the classifier takes
    throw Error(fmt::format("kernel {}: no fused classifier on {} operands", kernel.name, dtype_name(t)));
  }
  if (l.chunk < 1 || l.chunks != (d.vocab + l.chunk - 1) / l.chunk)
    throw Error(fmt::format("kernel {}: the classifier's CUDA chunks ({} of {}) do not cover its {} classes", kernel.name,
                            l.chunks, l.chunk, d.vocab));
  ClassifierGemms g;
  g.dx_in_scratch = k.backward && l.dx_acc >= 0;
  const int64_t launches = l.chunks + (k.backward ? (g.dx_in_scratch ? 1 : 0) : 1);
  if (static_cast<int64_t>(kernel.cuda_launches.size()) != launches)
    throw Error(fmt::format("kernel {}: a classifier of {} chunks has {} CUDA launches, not {}", kernel.name, l.chunks,
                            kernel.cuda_launches.size(), launches));
  for (int64_t c = 0; c < l.chunks; ++c) {
    const int64_t c0 = c * l.chunk, n = std::min(l.chunk, d.vocab - c0);
    const int64_t w_chunk = k.w + c0 * d.w_v_stride * es;
    ClassifierGemms::Chunk ch;
    MatmulDesc m;
    m.m = d.rows, m.n = n, m.k = d.d;
    m.a_m_stride = d.x_row_stride, m.a_k_stride = 1;
    m.b_k_stride = d.w_d_stride, m.b_n_stride = d.w_v_stride;
    m.c_m_stride = l.chunk;
    ch.logits = spec(t, t, t, m);
    ch.logits.a = k.x, ch.logits.b = w_chunk, ch.logits.c = l.logits;
    if (k.backward) {
      MatmulDesc w;
      w.m = n, w.n = d.d, w.k = d.rows;
      w.a_m_stride = 1, w.a_k_stride = l.chunk;
      w.b_k_stride = d.x_row_stride, w.b_n_stride = 1;
      w.c_m_stride = d.d;
      ch.dw = spec(t, t, t, w);
      ch.dw.a = l.logits, ch.dw.b = k.x, ch.dw.c = k.dw + c0 * d.d * es;
      MatmulDesc x;
      x.m = d.rows, x.n = d.d, x.k = n;
      x.a_m_stride = l.chunk, x.a_k_stride = 1;
      x.b_k_stride = d.w_v_stride, x.b_n_stride = d.w_d_stride;
      x.c_m_stride = d.d;
      ch.dx = spec(t, t, g.dx_in_scratch ? DType::F32 : t, x);
      ch.dx.a = l.logits, ch.dx.b = w_chunk, ch.dx.c = g.dx_in_scratch ? l.dx_acc : k.dx;
    }
    g.chunks.push_back(std::move(ch));
  }
  return g;
}

CudaClassifier::CudaClassifier(const LtContext& ctx, const KernelSpec& kernel, bool tf32, CUdeviceptr arena,
                               CUdeviceptr scratch) {
  const ClassifierGemms g = classifier_gemms(kernel);
  launches_ = static_cast<int>(kernel.cuda_launches.size());
  for (size_t c = 0; c < g.chunks.size(); ++c) {
    const ClassifierGemms::Chunk& s = g.chunks[c];
    Chunk ch;
    ch.logits = std::make_unique<LtMatmul>(ctx, s.logits, tf32, kernel.name, LtPlacement{arena, arena, scratch, false});
    if (std::get<ClassifierSpec>(kernel.payload).backward) {
      ch.dw = std::make_unique<LtMatmul>(ctx, s.dw, tf32, kernel.name, LtPlacement{scratch, arena, arena, false});
      ch.dx = std::make_unique<LtMatmul>(ctx, s.dx, tf32, kernel.name,
                                         LtPlacement{scratch, arena, g.dx_in_scratch ? scratch : arena, c > 0});
    }
    chunks_.push_back(std::move(ch));
  }
}

void CudaClassifier::enqueue(CUstream stream, const std::function<void(int)>& launch) const {
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const Chunk& ch = chunks_[c];
    ch.logits->enqueue(stream);
    launch(static_cast<int>(c));
    if (ch.dw) ch.dw->enqueue(stream);
    if (ch.dx) ch.dx->enqueue(stream);
  }
  for (int j = static_cast<int>(chunks_.size()); j < launches_; ++j) launch(j);
}

}  // namespace napkin::runtime::cuda
