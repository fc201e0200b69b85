// The fake GPU's cuBLASLt (fake_cuda.h defines the terms): the entry points
// runtime/cuda/cuda_driver.h resolves, for what the CUDA runtime asks of
// them (cublasLt.h is the reference for every enum and attribute size).
//
// Terms:
//  - matmul: D = alpha op(A) op(B) + beta C, column-major, op(A) m x k,
//    op(B) k x n, C and D m x n, each matrix `rows` x `cols` with leading
//    dimension ld >= rows, repeated BATCH_COUNT times at its
//    STRIDED_BATCH_OFFSET (elements). Products are summed in double and
//    rounded once to D's type (f32, f64, bf16 or f16); with compute type
//    32F_FAST_TF32 each f32 input is first rounded to TF32 (10 fraction
//    bits, nearest even). beta == 0 reads no C, as BLAS does.
//  - what is rejected as cuBLASLt rejects it: dims that do not agree with the
//    ops (INVALID_VALUE), ld < rows, a row-major or otherwise ordered
//    layout, batch counts that differ, a type mix cuBLASLt has no kernel for
//    (NOT_SUPPORTED), an attribute buffer of the wrong size, a pointer less
//    aligned than the chosen algorithm needs (min of the preference's
//    MIN_ALIGNMENT and 16 bytes), a workspace smaller than it needs.
//  - what a GPU would get wrong silently and the fake refuses, saying why on
//    stderr: an operand outside device memory, D overlapping A or B (a
//    kernel reading what it writes). The algorithm's workspace bytes are
//    overwritten with 0xff by every matmul, as a kernel may use them.
//  - epilogues: BIAS (one bias element per row of D, added after beta C, in
//    D's type or f32 with 32F compute), GELU, GELU_BIAS, GELU_AUX and
//    GELU_AUX_BIAS (tanh GELU after the bias; _AUX stores its input in D's
//    type at EPILOGUE_AUX_POINTER, EPILOGUE_AUX_LD a multiple of 8 apart)
//    and DGELU (D = sums * GELU'(aux)), BGRADA (the bias gradient: each
//    row of op(A) summed over k into BIAS_POINTER, in D's type; one batch
//    entry); others, device pointer mode and fp8 are unsupported here
//    (NOT_SUPPORTED). NAPKIN_FAKE_CUBLASLT_NO_BGRAD=1 makes the heuristic
//    find no algorithm for BGRADA, as a cuBLASLt may for some layouts.
#include <cstdlib>
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "fake_cuda/fake_cuda.h"

using napkin::fake_cuda::Fake;

struct cublasLtContext {};

namespace {

constexpr uint64_t kAlgoMagic = 0x6e61706b696e4c74ull;  // "napkinLt"
constexpr size_t kAlgoWorkspace = 1 << 20;

struct Desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N, trans_c = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // -1: D's type
  void* aux = nullptr;     // the gelu's input: stored (GELU_AUX*) or read (DGELU), D's type
  int64_t aux_ld = 0;
};

struct Layout {
  uint32_t type;
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;
};

struct Preference {
  uint32_t search_mode = 0;
  uint64_t max_workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};

Desc* desc(cublasLtMatmulDesc_t d) { return reinterpret_cast<Desc*>(d); }
Layout* layout(cublasLtMatrixLayout_t l) { return reinterpret_cast<Layout*>(l); }
Preference* preference(cublasLtMatmulPreference_t p) { return reinterpret_cast<Preference*>(p); }

// An attribute as a member: its bytes in and out, sizes checked.
template <class T>
cublasStatus_t set_value(T* member, const void* buf, size_t bytes) {
  if (!buf || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(member, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}
template <class T>
cublasStatus_t get_value(const T& member, void* buf, size_t bytes, size_t* written) {
  if (written) *written = sizeof(T);
  if (bytes == 0 && !buf && written) return CUBLAS_STATUS_SUCCESS;  // a size query
  if (!buf || bytes < sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buf, &member, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

int64_t type_bytes(uint32_t t) {
  switch (t) {
    case CUDA_R_64F: return 8;
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    default: return 0;
  }
}

// The problem of one matmul, checked as cuBLASLt checks it.
struct Problem {
  int64_t m, n, k;
  Desc op;
  Layout a, b, c, d;
};

bool has_bias(const Desc& d) { return (d.epilogue & CUBLASLT_EPILOGUE_BIAS) != 0 && d.epilogue != CUBLASLT_EPILOGUE_DGELU; }
bool has_aux(const Desc& d) { return (d.epilogue & 128) != 0; }  // GELU_AUX, GELU_AUX_BIAS, DGELU
bool has_bias_grad(const Desc& d) { return d.epilogue == CUBLASLT_EPILOGUE_BGRADA; }

// GELU, tanh form, and its derivative (what cuBLASLt's GELU epilogues compute).
double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_derivative(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

cublasStatus_t check_problem(const Problem& p) {
  for (const Layout* l : {&p.a, &p.b, &p.c, &p.d}) {
    if (l->order != CUBLASLT_ORDER_COL) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l->ld < static_cast<int64_t>(std::max<uint64_t>(l->rows, 1))) return CUBLAS_STATUS_INVALID_VALUE;
    if (l->batch != p.a.batch || l->batch < 1) return CUBLAS_STATUS_INVALID_VALUE;
  }
  auto [ar, ac] = p.op.trans_a == CUBLAS_OP_N ? std::pair{p.a.rows, p.a.cols} : std::pair{p.a.cols, p.a.rows};
  auto [br, bc] = p.op.trans_b == CUBLAS_OP_N ? std::pair{p.b.rows, p.b.cols} : std::pair{p.b.cols, p.b.rows};
  if (ac != br || p.c.rows != ar || p.c.cols != bc || p.d.rows != p.c.rows || p.d.cols != p.c.cols)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (p.op.trans_c != CUBLAS_OP_N) return CUBLAS_STATUS_NOT_SUPPORTED;
  switch (p.op.epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: case CUBLASLT_EPILOGUE_BIAS: case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_BIAS: case CUBLASLT_EPILOGUE_GELU_AUX: case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DGELU: case CUBLASLT_EPILOGUE_BGRADA: break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // The bias gradient: in D's type, one matrix.
  if (has_bias_grad(p.op) && ((p.op.bias_type != -1 && static_cast<uint32_t>(p.op.bias_type) != p.d.type) || p.d.batch != 1))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (p.op.pointer_mode != CUBLASLT_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
  // The bias: D's type, or f32 where D is bf16 or f16 with f32 compute.
  if (has_bias(p.op) && p.op.bias_type != -1 && static_cast<uint32_t>(p.op.bias_type) != p.d.type &&
      !(p.op.bias_type == CUDA_R_32F && p.op.compute == CUBLAS_COMPUTE_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // The gelu's input: a leading dimension of at least D's rows, a multiple of 8.
  if (has_aux(p.op) && (p.op.aux_ld < static_cast<int64_t>(p.d.rows) || p.op.aux_ld % 8 != 0))
    return CUBLAS_STATUS_INVALID_VALUE;
  // The type mixes (cuBLASLt's table of supported combinations) napkin uses.
  uint32_t ab = p.a.type;
  if (p.b.type != ab || p.c.type != p.d.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  bool ok = false;
  switch (p.op.compute) {
    case CUBLAS_COMPUTE_32F:
      ok = p.op.scale == CUDA_R_32F && ((ab == CUDA_R_32F && p.c.type == CUDA_R_32F) ||
                                        ((ab == CUDA_R_16BF || ab == CUDA_R_16F) &&
                                         (p.c.type == ab || p.c.type == CUDA_R_32F)));
      break;
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      ok = p.op.scale == CUDA_R_32F && ab == CUDA_R_32F && p.c.type == CUDA_R_32F;
      break;
    case CUBLAS_COMPUTE_64F: ok = p.op.scale == CUDA_R_64F && ab == CUDA_R_64F && p.c.type == CUDA_R_64F; break;
    default: break;
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

Problem problem_of(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                   cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d) {
  Problem p{0, 0, 0, *desc(op), *layout(a), *layout(b), *layout(c), *layout(d)};
  p.m = static_cast<int64_t>(p.d.rows);
  p.n = static_cast<int64_t>(p.d.cols);
  p.k = static_cast<int64_t>(p.op.trans_a == CUBLAS_OP_N ? p.a.cols : p.a.rows);
  return p;
}

// Bytes from the first to past the last element a layout touches.
int64_t span_bytes(const Layout& l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  int64_t elements = (l.batch - 1) * std::abs(l.stride) + (static_cast<int64_t>(l.cols) - 1) * l.ld +
                     static_cast<int64_t>(l.rows);
  return elements * type_bytes(l.type);
}

double tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  std::memcpy(&x, &u, 4);
  return x;
}

double load(const char* base, int64_t i, uint32_t type, bool round_tf32) {
  switch (type) {
    case CUDA_R_64F: {
      double v;
      std::memcpy(&v, base + i * 8, 8);
      return v;
    }
    case CUDA_R_32F: {
      float v;
      std::memcpy(&v, base + i * 4, 4);
      return round_tf32 ? tf32(v) : v;
    }
    case CUDA_R_16BF: {
      uint16_t h;
      std::memcpy(&h, base + i * 2, 2);
      uint32_t u = static_cast<uint32_t>(h) << 16;
      float v;
      std::memcpy(&v, &u, 4);
      return v;
    }
    default: {  // CUDA_R_16F
      _Float16 v;
      std::memcpy(&v, base + i * 2, 2);
      return static_cast<double>(v);
    }
  }
}

void store(char* base, int64_t i, uint32_t type, double value) {
  switch (type) {
    case CUDA_R_64F: std::memcpy(base + i * 8, &value, 8); return;
    case CUDA_R_32F: {
      float v = static_cast<float>(value);
      std::memcpy(base + i * 4, &v, 4);
      return;
    }
    case CUDA_R_16BF: {
      float f = static_cast<float>(value);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      uint16_t h = (u & 0x7fffffffu) > 0x7f800000u ? static_cast<uint16_t>((u >> 16) | 0x40u)
                                                     : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      std::memcpy(base + i * 2, &h, 2);
      return;
    }
    default: {
      _Float16 v = static_cast<_Float16>(value);
      std::memcpy(base + i * 2, &v, 2);
      return;
    }
  }
}

void run(const Problem& p, double alpha, double beta, const char* A, const char* B, const char* C, char* D) {
  bool round_tf32 = p.op.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  bool ta = p.op.trans_a != CUBLAS_OP_N, tb = p.op.trans_b != CUBLAS_OP_N;
  for (int32_t batch = 0; batch < p.d.batch; ++batch) {
    int64_t a0 = batch * p.a.stride, b0 = batch * p.b.stride, c0 = batch * p.c.stride, d0 = batch * p.d.stride;
    for (int64_t j = 0; j < p.n; ++j)
      for (int64_t i = 0; i < p.m; ++i) {
        double sum = 0;
        for (int64_t q = 0; q < p.k; ++q) {
          double x = load(A, a0 + (ta ? q + i * p.a.ld : i + q * p.a.ld), p.a.type, round_tf32);
          double y = load(B, b0 + (tb ? j + q * p.b.ld : q + j * p.b.ld), p.b.type, round_tf32);
          sum += x * y;
        }
        double value = alpha * sum;
        if (beta != 0) value += beta * load(C, c0 + i + j * p.c.ld, p.c.type, false);
        if (has_bias(p.op))  // one element per row of D
          value += load(static_cast<const char*>(p.op.bias), i, p.op.bias_type == -1 ? p.d.type : p.op.bias_type, false);
        const int64_t at_aux = d0 + i + j * p.op.aux_ld;
        if (p.op.epilogue == CUBLASLT_EPILOGUE_DGELU) {
          value *= gelu_derivative(load(static_cast<const char*>(p.op.aux), at_aux, p.d.type, false));
        } else if ((p.op.epilogue & CUBLASLT_EPILOGUE_GELU) != 0) {
          if (has_aux(p.op)) store(static_cast<char*>(p.op.aux), at_aux, p.d.type, value);
          value = gelu(value);
        }
        store(D, d0 + i + j * p.d.ld, p.d.type, value);
      }
    if (has_bias_grad(p.op))  // row i of op(A) summed over k
      for (int64_t i = 0; i < p.m; ++i) {
        double sum = 0;
        for (int64_t q = 0; q < p.k; ++q) sum += load(A, a0 + (ta ? q + i * p.a.ld : i + q * p.a.ld), p.a.type, false);
        store(static_cast<char*>(const_cast<void*>(p.op.bias)), i, p.d.type, sum);
      }
  }
}

cublasStatus_t refuse(const std::string& why) {
  std::fprintf(stderr, "napkin fake CUDA: cublasLtMatmul: %s\n", why.c_str());
  return CUBLAS_STATUS_INVALID_VALUE;
}

}  // namespace

extern "C" {

size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
#define NAME(s) \
  case s: return #s;
    NAME(CUBLAS_STATUS_SUCCESS)
    NAME(CUBLAS_STATUS_NOT_INITIALIZED)
    NAME(CUBLAS_STATUS_ALLOC_FAILED)
    NAME(CUBLAS_STATUS_INVALID_VALUE)
    NAME(CUBLAS_STATUS_ARCH_MISMATCH)
    NAME(CUBLAS_STATUS_MAPPING_ERROR)
    NAME(CUBLAS_STATUS_EXECUTION_FAILED)
    NAME(CUBLAS_STATUS_INTERNAL_ERROR)
    NAME(CUBLAS_STATUS_NOT_SUPPORTED)
#undef NAME
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the requested functionality is not supported";
    default: return "unknown error";
  }
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  if (Fake::get().precondition() != CUDA_SUCCESS) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  *d = reinterpret_cast<cublasLtMatmulDesc_t>(new Desc{compute, scale});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete desc(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
  if (!d) return CUBLAS_STATUS_NOT_INITIALIZED;
  Desc& x = *desc(d);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return set_value(&x.compute, buf, bytes);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return set_value(&x.scale, buf, bytes);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return set_value(&x.pointer_mode, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSA: return set_value(&x.trans_a, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set_value(&x.trans_b, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSC: return set_value(&x.trans_c, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_value(&x.epilogue, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_value(&x.bias, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_value(&x.bias_type, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set_value(&x.aux, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set_value(&x.aux_ld, buf, bytes);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, void* buf,
                                              size_t bytes, size_t* written) {
  if (!d) return CUBLAS_STATUS_NOT_INITIALIZED;
  const Desc& x = *desc(d);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return get_value(x.compute, buf, bytes, written);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return get_value(x.scale, buf, bytes, written);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return get_value(x.pointer_mode, buf, bytes, written);
    case CUBLASLT_MATMUL_DESC_TRANSA: return get_value(x.trans_a, buf, bytes, written);
    case CUBLASLT_MATMUL_DESC_TRANSB: return get_value(x.trans_b, buf, bytes, written);
    case CUBLASLT_MATMUL_DESC_TRANSC: return get_value(x.trans_c, buf, bytes, written);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return get_value(x.epilogue, buf, bytes, written);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  *l = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{static_cast<uint32_t>(type), CUBLASLT_ORDER_COL, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete layout(l);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t bytes) {
  if (!l) return CUBLAS_STATUS_NOT_INITIALIZED;
  Layout& x = *layout(l);
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return set_value(&x.type, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return set_value(&x.order, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return set_value(&x.rows, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return set_value(&x.cols, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_LD: return set_value(&x.ld, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set_value(&x.batch, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return set_value(&x.stride, buf, bytes);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t bytes, size_t* written) {
  if (!l) return CUBLAS_STATUS_NOT_INITIALIZED;
  const Layout& x = *layout(l);
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return get_value(x.type, buf, bytes, written);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return get_value(x.order, buf, bytes, written);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return get_value(x.rows, buf, bytes, written);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return get_value(x.cols, buf, bytes, written);
    case CUBLASLT_MATRIX_LAYOUT_LD: return get_value(x.ld, buf, bytes, written);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return get_value(x.batch, buf, bytes, written);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return get_value(x.stride, buf, bytes, written);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  *p = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete preference(p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t bytes) {
  if (!p) return CUBLAS_STATUS_NOT_INITIALIZED;
  Preference& x = *preference(p);
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return set_value(&x.search_mode, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set_value(&x.max_workspace, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set_value(&x.align[0], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set_value(&x.align[1], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set_value(&x.align[2], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set_value(&x.align[3], buf, bytes);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

// One algorithm: algo.data = {magic, alignment A, B, C, D it needs, workspace bytes}.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* count) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!op || !a || !b || !c || !d || !pref || requested < 1 || !results || !count) return CUBLAS_STATUS_INVALID_VALUE;
  *count = 0;
  if (cublasStatus_t s = check_problem(problem_of(op, a, b, c, d)); s != CUBLAS_STATUS_SUCCESS) return s;
  if (const char* no = std::getenv("NAPKIN_FAKE_CUBLASLT_NO_BGRAD");
      no && std::string(no) == "1" && has_bias_grad(*desc(op)))
    return CUBLAS_STATUS_NOT_SUPPORTED;  // what cuBLASLt answers where no kernel fits
  const Preference& p = *preference(pref);
  cublasLtMatmulHeuristicResult_t& r = results[0];
  std::memset(&r, 0, sizeof r);
  r.algo.data[0] = kAlgoMagic;
  for (int i = 0; i < 4; ++i) r.algo.data[1 + i] = std::min<uint32_t>(p.align[i], 16);
  r.workspaceSize = std::min<size_t>(p.max_workspace, kAlgoWorkspace);
  r.algo.data[5] = r.workspaceSize;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a_layout, const void* B, cublasLtMatrixLayout_t b_layout,
                              const void* beta, const void* C, cublasLtMatrixLayout_t c_layout, void* D,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  Fake& fake = Fake::get();
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (fake.precondition() != CUDA_SUCCESS) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (!op || !a_layout || !b_layout || !c_layout || !d_layout || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  Problem p = problem_of(op, a_layout, b_layout, c_layout, d_layout);
  if (cublasStatus_t s = check_problem(p); s != CUBLAS_STATUS_SUCCESS) return s;
  if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
  // The algorithm: the heuristic's, or (null) what it would choose by default.
  uint64_t need_align[4] = {16, 16, 16, 16};
  size_t need_workspace = 0;
  if (algo) {
    if (algo->data[0] != kAlgoMagic) return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < 4; ++i) need_align[i] = algo->data[1 + i];
    need_workspace = algo->data[5];
  }
  if (workspace_bytes < need_workspace) return CUBLAS_STATUS_INVALID_VALUE;
  const void* pointers[4] = {A, B, C, D};
  for (int i = 0; i < 4; ++i)
    if (reinterpret_cast<uintptr_t>(pointers[i]) % need_align[i] != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  bool read_c = p.op.scale == CUDA_R_64F ? *static_cast<const double*>(beta) != 0 : *static_cast<const float*>(beta) != 0;
  const char* names = "ABCD";
  const Layout* layouts[4] = {&p.a, &p.b, &p.c, &p.d};
  for (int i = 0; i < 4; ++i) {
    if (i == 2 && !read_c) continue;
    if (p.k == 0 && i < 2) continue;
    if (!fake.device_region(pointers[i], static_cast<size_t>(span_bytes(*layouts[i]))))
      return refuse(std::string(1, names[i]) + " is not inside one device allocation");
  }
  if (p.k > 0) {
    auto overlaps = [&](int i) {
      auto x = reinterpret_cast<uintptr_t>(pointers[i]), dx = reinterpret_cast<uintptr_t>(D);
      return x < dx + span_bytes(p.d) && dx < x + span_bytes(*layouts[i]);
    };
    if (overlaps(0) || overlaps(1)) return refuse("D overlaps A or B");
  }
  if (C == D && (p.c.ld != p.d.ld || p.c.stride != p.d.stride)) return CUBLAS_STATUS_INVALID_VALUE;
  if (has_bias_grad(p.op)) {
    if (!p.op.bias || !fake.device_region(p.op.bias, static_cast<size_t>(p.m * type_bytes(p.d.type))))
      return refuse("the bias gradient is not inside one device allocation");
    auto x = reinterpret_cast<uintptr_t>(p.op.bias), dx = reinterpret_cast<uintptr_t>(D);
    if (x < dx + span_bytes(p.d) && dx < x + static_cast<uintptr_t>(p.m * type_bytes(p.d.type)))
      return refuse("D overlaps the bias gradient");
  }
  if (has_bias(p.op)) {
    const uint32_t bias_type = p.op.bias_type == -1 ? p.d.type : static_cast<uint32_t>(p.op.bias_type);
    if (!p.op.bias || !fake.device_region(p.op.bias, static_cast<size_t>(p.m * type_bytes(bias_type))))
      return refuse("the bias is not inside one device allocation");
  }
  if (has_aux(p.op)) {
    Layout aux = p.d;
    aux.ld = p.op.aux_ld;
    if (!p.op.aux || !fake.device_region(p.op.aux, static_cast<size_t>(span_bytes(aux))))
      return refuse("the epilogue's aux is not inside one device allocation");
    // cuBLASLt documents D in place of C, never of the aux.
    auto x = reinterpret_cast<uintptr_t>(p.op.aux), dx = reinterpret_cast<uintptr_t>(D);
    if (x < dx + span_bytes(p.d) && dx < x + span_bytes(aux)) return refuse("D overlaps the epilogue's aux");
  }
  if (need_workspace > 0 && !fake.device_region(workspace, need_workspace))
    return refuse("the workspace is not inside one device allocation");
  // Host pointer mode: alpha and beta are read now, and a capture records them.
  double alpha_v = p.op.scale == CUDA_R_64F ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  double beta_v = p.op.scale == CUDA_R_64F ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  CUresult r = fake.submit(stream, [=]() -> CUresult {
    if (need_workspace > 0) std::memset(workspace, 0xff, need_workspace);
    run(p, alpha_v, beta_v, static_cast<const char*>(A), static_cast<const char*>(B), static_cast<const char*>(C),
        static_cast<char*>(D));
    return CUDA_SUCCESS;
  });
  return r == CUDA_SUCCESS ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
