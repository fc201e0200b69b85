#include "runtime/cuda/cublaslt_matmul.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "runtime/error.h"

namespace napkin::runtime::cuda {

namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// napkin's row-major X (r x c, strides rs, cs) as cuBLASLt stores it (file
// comment, "stored operand"); false when neither dim is contiguous.
bool store(int64_t r, int64_t c, int64_t rs, int64_t cs, LtOperand* o) {
  if ((cs == 1 || c <= 1) && (r <= 1 || rs >= std::max<int64_t>(c, 1))) {
    *o = {false, c, r, r <= 1 ? std::max<int64_t>(c, 1) : rs, 0};
    return true;
  }
  if ((rs == 1 || r <= 1) && (c <= 1 || cs >= std::max<int64_t>(r, 1))) {
    *o = {true, r, c, c <= 1 ? std::max<int64_t>(r, 1) : cs, 0};
    return true;
  }
  return false;
}

}  // namespace

LtShape lt_shape(const MatmulDesc& d) {
  auto fail = [&](const std::string& what) { throw Error("matmul " + d.to_string() + ": " + what); };
  d.check_sizes();
  const size_t nb = d.batch.size();
  bool empty = d.m == 0 || d.n == 0;
  for (int64_t size : d.batch) empty = empty || size == 0;
  LtShape s;
  s.m = d.n, s.n = d.m, s.k = d.k;
  if (empty) return s;
  for (size_t i = 0; i < nb; ++i)
    if (d.batch[i] > 1 && d.c_batch_stride[i] == 0)
      fail("C cannot broadcast over a batch dim (every entry is written)");
  if (d.m > 1 && d.c_m_stride < d.n) fail("c_m_stride must be >= n (rows of C may not overlap)");
  if (s.m > kMaxInt32 || s.n > kMaxInt32 || s.k > kMaxInt32) fail("cuBLASLt takes dims up to 2^31 - 1");

  if (d.k == 0) {  // A and B have no elements (C = 0 is a fill, not a cuBLASLt call): any valid layout
    s.a = {false, s.m, 0, std::max<int64_t>(s.m, 1), 0};
    s.b = {false, 0, s.n, 1, 0};
  } else if (!store(d.k, d.n, d.b_k_stride, d.b_n_stride, &s.a)) {
    fail(fmt::format("B has no contiguous dim (k stride {}, n stride {}); cuBLASLt reads only matrices with one",
                     d.b_k_stride, d.b_n_stride));
  } else if (!store(d.m, d.k, d.a_m_stride, d.a_k_stride, &s.b)) {
    fail(fmt::format("A has no contiguous dim (m stride {}, k stride {}); cuBLASLt reads only matrices with one",
                     d.a_m_stride, d.a_k_stride));
  }
  store(d.m, d.n, d.c_m_stride, 1, &s.d);

  std::vector<MatmulDesc::BatchDim> dims = d.merged_batch();
  // The strided batch: the largest dim, the innermost among equals.
  int strided = -1;
  for (int i = 0; i < static_cast<int>(dims.size()); ++i)
    if (strided < 0 || dims[i].size >= dims[strided].size) strided = i;
  if (strided >= 0) {
    const MatmulDesc::BatchDim& x = dims[strided];
    if (x.size > kMaxInt32) fail("cuBLASLt takes batch counts up to 2^31 - 1");
    s.batch_count = x.size;
    s.a.batch_stride = x.b;  // Lt A is napkin's B
    s.b.batch_stride = x.a;
    s.d.batch_stride = x.c;
    dims.erase(dims.begin() + strided);
  }
  // Calls: every entry of the remaining dims, outermost first.
  s.calls.push_back({});
  for (const MatmulDesc::BatchDim& x : dims) {
    std::vector<LtCall> next;
    next.reserve(s.calls.size() * static_cast<size_t>(x.size));
    for (const LtCall& call : s.calls)
      for (int64_t j = 0; j < x.size; ++j) next.push_back({call.a + j * x.a, call.b + j * x.b, call.c + j * x.c});
    s.calls = std::move(next);
  }
  return s;
}

LtTypes lt_types(DType a, DType b, DType c, bool tf32) {
  auto fail = [&] {
    throw Error(fmt::format("no cuBLASLt matmul of {} by {} into {}", dtype_name(a), dtype_name(b), dtype_name(c)));
  };
  auto fp8 = [](DType t) { return t == DType::F8E4M3 || t == DType::F8E5M2; };
  auto low = [](DType t) -> cudaDataType_t { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F; };
  LtTypes t;
  if (a == DType::F32 && b == DType::F32 && c == DType::F32) {
    t.compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  } else if (a == DType::F64 && b == DType::F64 && c == DType::F64) {
    t.a = t.b = t.c = CUDA_R_64F;
    t.compute = CUBLAS_COMPUTE_64F;
    t.scale = CUDA_R_64F;
  } else if ((a == DType::BF16 || a == DType::F16) && b == a && (c == a || c == DType::F32)) {
    t.a = t.b = low(a);
    t.c = c == DType::F32 ? CUDA_R_32F : low(c);
  } else if (fp8(a) && fp8(b) && !(a == DType::F8E5M2 && b == DType::F8E5M2) &&
             (c == DType::BF16 || c == DType::F16 || c == DType::F32)) {
    t.a = a == DType::F8E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    t.b = b == DType::F8E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    t.c = c == DType::F32 ? CUDA_R_32F : low(c);
    t.fp8 = true;
  } else {
    fail();
  }
  return t;
}

int64_t lt_type_bytes(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_64F: return 8;
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2: return 1;
    default: throw Error(fmt::format("no size for cudaDataType {}", static_cast<int>(t)));
  }
}

void check_fp8_layout(const LtShape& s, const std::string& kernel) {
  auto fail = [&](const std::string& what) {
    throw Error(fmt::format("kernel {}: fp8 matmul on cuBLASLt: {}", kernel, what));
  };
  if (!s.a.transpose || s.b.transpose)
    fail("A and B must both be contiguous along k (cuBLASLt's fp8 kernels take only the TN layout)");
  for (auto [name, v] : {std::pair{"m", s.n}, {"n", s.m}, {"k", s.k}, {"B's leading dim", s.a.ld},
                         {"A's leading dim", s.b.ld}, {"C's leading dim", s.d.ld}})
    if (v % 16 != 0) fail(fmt::format("{} is {}, not a multiple of 16", name, v));
}

uint32_t pointer_alignment(const std::vector<int64_t>& byte_offsets) {
  uint32_t align = 256;
  for (int64_t off : byte_offsets)
    while (align > 1 && off % align != 0) align /= 2;
  return align;
}

LtDescriptors::LtDescriptors(const CublasLt& lt, const LtShape& s, const LtTypes& t, uint64_t workspace_bytes,
                             uint32_t a_align, uint32_t b_align, uint32_t c_align, CUdeviceptr a_scale,
                             CUdeviceptr b_scale, const LtEpilogue& epilogue)
    : lt_(lt) {
  try {
    NAPKIN_CUBLASLT(lt, cublasLtMatmulDescCreate(&op, t.compute, t.scale));
    auto set_op = [&](cublasLtMatmulDescAttributes_t attr, const void* value, size_t size) {
      NAPKIN_CUBLASLT(lt, cublasLtMatmulDescSetAttribute(op, attr, value, size));
    };
    cublasOperation_t trans_a = s.a.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t trans_b = s.b.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
    set_op(CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a));
    set_op(CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b));
    if (t.fp8) {
      // Lt A is napkin's B: the scales swap with the operands.
      void* lt_a_scale = reinterpret_cast<void*>(b_scale);
      void* lt_b_scale = reinterpret_cast<void*>(a_scale);
      set_op(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &lt_a_scale, sizeof(lt_a_scale));
      set_op(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &lt_b_scale, sizeof(lt_b_scale));
    }
    if (epilogue.kind != CUBLASLT_EPILOGUE_DEFAULT) set_op(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue.kind, sizeof(epilogue.kind));
    if (epilogue.bias) {
      // napkin's bias runs along n, cuBLASLt's rows of D; f32, as the IR adds it.
      void* pointer = reinterpret_cast<void*>(epilogue.bias);
      cudaDataType_t type = CUDA_R_32F;
      set_op(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &pointer, sizeof(pointer));
      set_op(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type));
    }
    if (epilogue.aux) {  // the gelu's input, in D's type (cuBLASLt's default aux type)
      void* pointer = reinterpret_cast<void*>(epilogue.aux);
      set_op(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &pointer, sizeof(pointer));
      set_op(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &epilogue.aux_ld, sizeof(epilogue.aux_ld));
    }
    auto layout = [&](cublasLtMatrixLayout_t* l, cudaDataType_t type, const LtOperand& o) {
      NAPKIN_CUBLASLT(lt, cublasLtMatrixLayoutCreate(l, type, static_cast<uint64_t>(o.rows),
                                                     static_cast<uint64_t>(o.cols), o.ld));
      if (s.batch_count > 1) {
        int32_t count = static_cast<int32_t>(s.batch_count);
        int64_t stride = o.batch_stride;
        NAPKIN_CUBLASLT(lt, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                             sizeof(count)));
        NAPKIN_CUBLASLT(lt, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                             &stride, sizeof(stride)));
      }
    };
    layout(&lt_a, t.b, s.a);
    layout(&lt_b, t.a, s.b);
    layout(&d, t.c, s.d);

    NAPKIN_CUBLASLT(lt, cublasLtMatmulPreferenceCreate(&preference));
    auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* value, size_t size) {
      NAPKIN_CUBLASLT(lt, cublasLtMatmulPreferenceSetAttribute(preference, attr, value, size));
    };
    set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes));
    // Lt A is napkin's B; C and D are the same pointer.
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &b_align, sizeof(b_align));
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a_align, sizeof(a_align));
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c_align, sizeof(c_align));
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &c_align, sizeof(c_align));
  } catch (...) {
    release();
    throw;
  }
}

LtEpilogue lt_epilogue(const GemmEpilogueSpec& e, int64_t n, CUdeviceptr arena) {
  LtEpilogue r;
  const bool bias = e.bias >= 0, aux = e.aux >= 0;
  if (bias) r.bias = arena + static_cast<CUdeviceptr>(e.bias);
  if (aux) {
    r.aux = arena + static_cast<CUdeviceptr>(e.aux);
    r.aux_ld = n;  // napkin's rows of D, n apart: cuBLASLt's columns
  }
  if (e.activation == GemmActivation::Gelu) {
    r.kind = aux ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                 : (bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
  } else if (e.activation == GemmActivation::GeluGrad) {
    if (!aux || bias || e.residual >= 0) throw Error("a gelu gradient epilogue reads its aux and adds nothing");
    r.kind = CUBLASLT_EPILOGUE_DGELU;
  } else {
    if (aux) throw Error("an aux without a gelu");
    r.kind = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
  return r;
}

LtDescriptors::~LtDescriptors() { release(); }

void LtDescriptors::release() noexcept {
  if (preference) lt_.cublasLtMatmulPreferenceDestroy(preference);
  if (d) lt_.cublasLtMatrixLayoutDestroy(d);
  if (lt_b) lt_.cublasLtMatrixLayoutDestroy(lt_b);
  if (lt_a) lt_.cublasLtMatrixLayoutDestroy(lt_a);
  if (op) lt_.cublasLtMatmulDescDestroy(op);
  preference = nullptr, d = lt_b = lt_a = nullptr, op = nullptr;
}

LtMatmul::LtMatmul(const LtContext& ctx, const MatmulSpec& spec, bool tf32, const std::string& kernel,
                   CUdeviceptr arena, CUdeviceptr a_scale, CUdeviceptr b_scale)
    : LtMatmul(ctx, spec, tf32, kernel, LtPlacement{arena, arena, arena, false}, a_scale, b_scale) {}

LtMatmul::LtMatmul(const LtContext& ctx, const MatmulSpec& spec, bool tf32, const std::string& kernel, LtPlacement where)
    : LtMatmul(ctx, spec, tf32, kernel, where, 0, 0) {}

LtMatmul::LtMatmul(const LtContext& ctx, const MatmulSpec& spec, bool tf32, const std::string& kernel,
                   LtPlacement where, CUdeviceptr a_scale, CUdeviceptr b_scale)
    : ctx_(ctx) {
  const std::optional<GemmEpilogueSpec>& epilogue = spec.epilogue;
  try {
    shape_ = lt_shape(spec.desc);
    // With an epilogue cuBLASLt's D is napkin's D, in its dtype; the f32 sums stay in the kernel.
    types_ = lt_types(spec.a_dtype, spec.b_dtype, epilogue ? epilogue->d_dtype : spec.c_dtype, tf32);
    if (epilogue && (shape_.calls.size() != 1 || shape_.batch_count != 1 || spec.c != epilogue->d || types_.fp8))
      throw Error("an epilogue needs one plain product into D");
    if (types_.fp8) check_fp8_layout(shape_, kernel);
  } catch (const Error& e) {
    throw Error("kernel " + kernel + ": " + e.what());
  }
  a_ = where.a + static_cast<CUdeviceptr>(spec.a);
  b_ = where.b + static_cast<CUdeviceptr>(spec.b);
  c_ = where.c + static_cast<CUdeviceptr>(spec.c);
  // The residual is cuBLASLt's C (beta = 1), read where it is: D = A B + residual + bias.
  const bool residual = epilogue && epilogue->residual >= 0;
  c_in_ = residual ? where.c + static_cast<CUdeviceptr>(epilogue->residual) : c_;
  accumulate_ = where.accumulate || residual;
  beta32_ = accumulate_ ? 1.0f : 0.0f;
  beta64_ = accumulate_ ? 1.0 : 0.0;
  if (epilogue && shape_.k == 0) throw Error("kernel " + kernel + ": an epilogue GEMM with k = 0");
  if (spec.bias_grad >= 0 && (shape_.k == 0 || shape_.calls.empty()))
    throw Error("kernel " + kernel + ": a bias gradient of a GEMM with no elements");
  if (shape_.calls.empty() || shape_.k == 0) return;  // nothing to compute, or a zero fill (enqueue)
  if (types_.fp8 && (a_scale == 0 || b_scale == 0))
    throw Error("kernel " + kernel + ": an fp8 matmul on cuBLASLt needs the scales of A and B");

  std::vector<int64_t> a_off, b_off, c_off;
  int64_t ea = lt_type_bytes(types_.a), eb = lt_type_bytes(types_.b), ec = lt_type_bytes(types_.c);
  for (const LtCall& call : shape_.calls) {
    a_off.push_back(spec.a + call.a * ea);
    b_off.push_back(spec.b + call.b * eb);
    c_off.push_back(spec.c + call.c * ec);
    if (residual) c_off.push_back(epilogue->residual + call.c * ec);  // C and D share one layout and alignment
  }
  LtEpilogue lt_ep;
  try {
    if (epilogue) lt_ep = lt_epilogue(*epilogue, spec.desc.n, where.c);
  } catch (const Error& e) {
    throw Error("kernel " + kernel + ": " + e.what());
  }
  const bool bias = lt_ep.bias != 0;
  if (spec.bias_grad >= 0) {
    // napkin's B summed over k is cuBLASLt's A summed over k, one element per row of D (napkin's n), in D's type (f32).
    if (epilogue || shape_.calls.size() != 1 || shape_.batch_count != 1 || types_.c != CUDA_R_32F)
      throw Error("kernel " + kernel + ": a bias gradient needs one plain product storing f32, without an epilogue");
    lt_ep.kind = CUBLASLT_EPILOGUE_BGRADA;
    lt_ep.bias = where.c + static_cast<CUdeviceptr>(spec.bias_grad);
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  auto choose = [&] {
    desc_ = std::make_unique<LtDescriptors>(ctx_.lt, shape_, types_, ctx_.workspace_bytes, pointer_alignment(a_off),
                                            pointer_alignment(b_off), pointer_alignment(c_off), a_scale, b_scale, lt_ep);
    found = 0;
    const cublasStatus_t status = ctx_.lt.cublasLtMatmulAlgoGetHeuristic(
        ctx_.handle, desc_->op, desc_->lt_a, desc_->lt_b, desc_->d, desc_->d, desc_->preference, 1, &result, &found);
    // cuBLASLt answers NOT_SUPPORTED where no kernel fits the configuration: for BGRADA, the fallback below.
    if (status == CUBLAS_STATUS_NOT_SUPPORTED && lt_ep.kind == CUBLASLT_EPILOGUE_BGRADA) return false;
    check_call(ctx_.lt, status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    return found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  };
  if (!choose() && spec.bias_grad >= 0) {
    // No BGRADA kernel for this layout: the product alone, and the bias gradient as ones[1, k] x B after it.
    std::fprintf(stderr, "napkin: kernel %s: cuBLASLt has no bias-gradient epilogue (BGRADA) for this product; "
                         "its bias gradient is a second GEMM\n", kernel.c_str());
    lt_ep = {};
    add_bias_grad_gemm(spec, kernel, where);
    choose();
  }
  if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS)
    throw Error(fmt::format("kernel {}: cuBLASLt has no algorithm for matmul {} ({} x {} -> {}{})", kernel,
                            spec.desc.to_string(), dtype_name(spec.a_dtype), dtype_name(spec.b_dtype),
                            dtype_name(epilogue ? epilogue->d_dtype : spec.c_dtype),
                            epilogue ? fmt::format(", epilogue:{}{}{}", residual ? " + residual" : "",
                                                      bias ? " + f32 bias" : "",
                                                      epilogue->activation == GemmActivation::None ? ""
                                                          : fmt::format(", {}", activation_name(epilogue->activation)))
                                        : ""));
  algo_ = result.algo;
}

DeviceBuffer::DeviceBuffer(const CudaDriver& driver, size_t bytes) : driver_(&driver) {
  NAPKIN_CU(driver, cuMemAlloc(&pointer_, bytes));
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (pointer_) driver_->cuMemFree(pointer_);
    driver_ = other.driver_;
    pointer_ = std::exchange(other.pointer_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (pointer_) driver_->cuMemFree(pointer_);
}

void LtMatmul::add_bias_grad_gemm(const MatmulSpec& spec, const std::string& kernel, LtPlacement where) {
  const MatmulDesc& d = spec.desc;
  const int64_t eb = lt_type_bytes(types_.b);
  const uint16_t one16 = spec.b_dtype == DType::BF16 ? 0x3f80 : 0x3c00;  // 1.0 in bf16, f16
  const float one32 = 1.0f;
  std::vector<char> ones(static_cast<size_t>(d.k * eb));
  for (int64_t i = 0; i < d.k; ++i) std::memcpy(ones.data() + i * eb, eb == 2 ? static_cast<const void*>(&one16) : &one32, eb);
  ones_ = DeviceBuffer(ctx_.driver, ones.size());
  NAPKIN_CU(ctx_.driver, cuMemcpyHtoDAsync(ones_.get(), ones.data(), ones.size(), nullptr));
  NAPKIN_CU(ctx_.driver, cuStreamSynchronize(nullptr));
  MatmulSpec sums;  // sums[1, n] = ones[1, k] B[k, n]
  sums.a = 0;
  sums.b = spec.b;
  sums.c = spec.bias_grad;
  sums.a_dtype = sums.b_dtype = spec.b_dtype;
  sums.c_dtype = DType::F32;
  sums.desc = MatmulDesc::plain(1, d.n, d.k);
  sums.desc.b_k_stride = d.b_k_stride;
  sums.desc.b_n_stride = d.b_n_stride;
  // Not in TF32: the sums as exact as the f32 accumulation makes them.
  bias_grad_gemm_ = std::make_unique<LtMatmul>(ctx_, sums, /*tf32=*/false, kernel + " (its bias gradient)",
                                               LtPlacement{ones_.get(), where.b, where.c, false});
}

void LtMatmul::enqueue(CUstream stream) const {
  const LtShape& s = shape_;
  int64_t ea = lt_type_bytes(types_.a), eb = lt_type_bytes(types_.b), ec = lt_type_bytes(types_.c);
  if (s.k == 0 && accumulate_) return;  // C += 0
  if (s.k == 0) {  // C = 0: each entry's m rows of n elements, c_m apart
    for (const LtCall& call : s.calls)
      for (int64_t i = 0; i < s.batch_count; ++i)
        NAPKIN_CU(ctx_.driver, cuMemsetD2D8Async(c_ + static_cast<CUdeviceptr>((call.c + i * s.d.batch_stride) * ec),
                                                 static_cast<size_t>(s.d.ld * ec), 0, static_cast<size_t>(s.m * ec),
                                                 static_cast<size_t>(s.n), stream));
    return;
  }
  const void* alpha = types_.scale == CUDA_R_64F ? static_cast<const void*>(&alpha64_) : &alpha32_;
  const void* beta = types_.scale == CUDA_R_64F ? static_cast<const void*>(&beta64_) : &beta32_;
  for (const LtCall& call : s.calls) {
    auto* a = reinterpret_cast<const void*>(a_ + static_cast<CUdeviceptr>(call.a * ea));
    auto* b = reinterpret_cast<const void*>(b_ + static_cast<CUdeviceptr>(call.b * eb));
    auto* c = reinterpret_cast<void*>(c_ + static_cast<CUdeviceptr>(call.c * ec));
    auto* c_in = reinterpret_cast<const void*>(c_in_ + static_cast<CUdeviceptr>(call.c * ec));
    NAPKIN_CUBLASLT(ctx_.lt, cublasLtMatmul(ctx_.handle, desc_->op, alpha, b, desc_->lt_a, a, desc_->lt_b, beta, c_in,
                                            desc_->d, c, desc_->d, &algo_, reinterpret_cast<void*>(ctx_.workspace),
                                            ctx_.workspace_bytes, stream));
  }
  if (bias_grad_gemm_) bias_grad_gemm_->enqueue(stream);
}

}  // namespace napkin::runtime::cuda
