// Attention against a KV cache as CUDA C (ir/loop.h's CachedAttentionParams):
// the decode step of `napkin sample` (passes/derive_inference.h). Decoding is
// memory-bound (each new token reads its whole cache once), so the kernel is
// plain SIMT code that reads every cache row once per query head.
//
// Launches (B batch, Hq query heads, Hk kv heads, n new rows, S cache rows, D head_dim):
//  NAME    grid-stride over B*Hk*n*D: the new rows of k and v into both caches
//          at their positions (an id outside [0, S) is NAPKIN_BAD_INDEX).
//  NAME_2  one 128-thread block per (b, query head, row i): the scores of
//          the cache rows j <= positions[i] (thread t takes rows t, t + 128,
//          ...) into shared memory, the block's max and sum (warp
//          butterflies, then across warps), then o[d] by thread d (and
//          d + 128, ...), summing p_j v_j over the rows in order.
// Arithmetic in f32 (f64 for f64); every sum has an order fixed by the shape.
// Rotary embeddings (CachedAttentionParams::rope): NAME rotates each new k
// element with its pair partner at the row's position before it writes the
// cache (which so holds rotated keys); NAME_2 rotates the query row into
// shared memory first. Angles as codegen/cuda/attention_device.cpp's: the f32
// product (float)p * inv_freq_j, frequencies from the host (NAME_rope_inv),
// cos and sin in the arithmetic's type rounded to f32.
#include <fmt/format.h>

#include "codegen/cuda/emit.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cuda::detail {

namespace {

constexpr int kBlock = 128;

// Element (b, h, row, d) of a 4-D operand with head_dim contiguous.
std::string at(const Operand& o, const std::string& b, const std::string& h, const std::string& row,
               const std::string& d) {
  return fmt::format("{}LL * {} + {}LL * {} + {}LL * {} + {}", o.strides[0], b, o.strides[1], h, o.strides[2], row, d);
}

// Element d of a row of o at element index `row` + d, rotated at position p
// with its pair partner (rope of head_dim D): a statement declaring `name`.
std::string rotated_element(const Operand& o, const std::string& row, const std::string& kernel, bool half, int64_t D,
                            const std::string& acc, const std::string& name) {
  const int64_t H = D / 2;
  const std::string pair = half ? fmt::format("(d % {}LL)", H) : "(d / 2)";
  const std::string partner = half ? fmt::format("(d < {0}LL ? d + {0}LL : d - {0}LL)", H) : "(d ^ 1LL)";
  const std::string first = half ? fmt::format("d < {}LL", H) : "(d & 1LL) == 0";
  return fmt::format(
      "const float {0}_a = (float)p * {1}_rope_inv[{2}]; const {3} {0}_c = ({3})(float)napkin_cos(({3}){0}_a), {0}_s = "
      "({3})(float)napkin_sin(({3}){0}_a); const {3} {0}_x = ({3}){4}, {0}_y = ({3}){5}; const {3} {0} = {6} ? {0}_x * {0}_c - "
      "{0}_y * {0}_s : {0}_x * {0}_c + {0}_y * {0}_s;",
      name, kernel, pair, acc, load(o, row + " + d"), load(o, row + " + " + partner), first);
}

}  // namespace

EmittedKernel emit_cached_attention(const Kernel& k, int index) {
  NAPKIN_INTERNAL_CHECK(k.inputs.size() == 6, "cached attention kernel {} with {} inputs", k.name, k.inputs.size());
  const Operand &q = k.inputs[0], &kn = k.inputs[1], &vn = k.inputs[2], &kc = k.inputs[3], &vc = k.inputs[4],
                &pos = k.inputs[5], &o = k.output;
  const int64_t B = q.sizes[0], HQ = q.sizes[1], HK = kn.sizes[1], N = q.sizes[2], S = kc.sizes[2], D = q.sizes[3];
  const std::string acc = q.dtype == ir::DType::F64 ? "double" : "float";
  const int64_t score_bytes = S * (q.dtype == ir::DType::F64 ? 8 : 4);
  NAPKIN_INTERNAL_CHECK(score_bytes <= 40 * 1024, "cached attention kernel {}: a cache of {} rows does not fit its "
                        "scores in shared memory", k.name, S);
  const double scale = k.cached_attention().scale;
  const std::optional<ir::RopeParams>& rope = k.cached_attention().rope;
  const bool half = rope && rope->style == ir::RopeStyle::Half;
  Src s;
  if (rope) emit_rope_frequencies(s, k.name + "_rope_inv", *rope, D);

  // The new rows into the caches.
  const int64_t items = B * HK * N * D;
  begin_kernel(s, k.name, kBlock);
  s.open("for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < {}LL; t += (long long)gridDim.x * blockDim.x) {{",
         items);
  s.line("const long long d = t % {0}LL, i = (t / {0}LL) % {1}LL, h = (t / ({0}LL * {1}LL)) % {2}LL, b = t / ({0}LL * {1}LL * {2}LL);",
         D, N, HK);
  s.line("const long long p = (long long){};", load(pos, "i"));
  s.open("if ((unsigned long long)p >= {}ull) {{", S);
  s.line("if (d == 0) NAPKIN_BAD_INDEX({}, p, {}LL);", index, S);
  s.line("continue;");
  s.close();
  if (rope) {
    s.line("{}", rotated_element(kn, at(kn, "b", "h", "i", "0"), k.name, half, D, acc, "kr"));
    s.line("{}", store(kc, at(kc, "b", "h", "p", "d"), "kr"));
  } else {
    s.line("{}", fmt::format("{}[{}] = {}[{}];", pointer(kc), at(kc, "b", "h", "p", "d"), pointer(kn), at(kn, "b", "h", "i", "d")));
  }
  s.line("{}", fmt::format("{}[{}] = {}[{}];", pointer(vc), at(vc, "b", "h", "p", "d"), pointer(vn), at(vn, "b", "h", "i", "d")));
  s.close();
  s.close();

  // Each query row against the cache rows up to its position.
  begin_kernel(s, k.name + "_2", kBlock);
  s.line("__shared__ {} scores[{}];", acc, S);
  s.line("__shared__ {} partial[{}];", acc, kBlock / 32);
  s.line("const long long i = blockIdx.x % {0}LL, h = (blockIdx.x / {0}LL) % {1}LL, b = blockIdx.x / ({0}LL * {1}LL);", N, HQ);
  s.line("const long long kh = h / {}LL;", HQ / HK);
  s.line("const long long p = (long long){};", load(pos, "i"));
  s.line("if ((unsigned long long)p >= {}ull) return;  // reported by the first launch", S);
  s.line("const long long visible = p + 1;");
  std::string q_elem = fmt::format("({}){}", acc, load(q, at(q, "b", "h", "i", "d")));
  if (rope) {  // the query row rotated at its position, once
    s.line("__shared__ {} qr[{}];", acc, D);
    s.open("for (long long d = threadIdx.x; d < {}LL; d += {}) {{", D, kBlock);
    s.line("{}", rotated_element(q, at(q, "b", "h", "i", "0"), k.name, half, D, acc, "x"));
    s.line("qr[d] = x;");
    s.close();
    s.line("__syncthreads();");
    q_elem = "qr[d]";
  }
  s.line("{} m = {};", acc, combine_of(ir::Combiner::Max, q.dtype == ir::DType::F64 ? ir::DType::F64 : ir::DType::F32).identity);
  s.open("for (long long j = threadIdx.x; j < visible; j += {}) {{", kBlock);
  s.line("{} dot = 0;", acc);
  s.line("for (long long d = 0; d < {}LL; ++d) dot += {} * ({}){};", D, q_elem, acc,
         load(kc, at(kc, "b", "kh", "j", "d")));
  s.line("scores[j] = dot * ({}){};", acc, literal(q.dtype == ir::DType::F64 ? ir::DType::F64 : ir::DType::F32, scale));
  s.line("m = scores[j] > m ? scores[j] : m;");
  s.close();
  auto block_reduce = [&](const std::string& v, const std::string& op) {
    s.line("{0} = napkin_warp_reduce({0}, {1}());", v, op);
    s.line("if ((threadIdx.x & 31u) == 0u) partial[threadIdx.x >> 5] = {};", v);
    s.line("__syncthreads();");
    s.line("{} = partial[0];", v);
    s.line("for (int w = 1; w < {2}; ++w) {0} = {1}()({0}, partial[w]);", v, op, kBlock / 32);
    s.line("__syncthreads();");
  };
  block_reduce("m", "napkin_max_op");
  s.line("{} sum = 0;", acc);
  s.open("for (long long j = threadIdx.x; j < visible; j += {}) {{", kBlock);
  s.line("scores[j] = {}(scores[j] - m);", q.dtype == ir::DType::F64 ? "exp" : "expf");
  s.line("sum += scores[j];");
  s.close();
  block_reduce("sum", "napkin_sum_op");
  s.open("for (long long d = threadIdx.x; d < {}LL; d += {}) {{", D, kBlock);
  s.line("{} out = 0;", acc);
  s.line("for (long long j = 0; j < visible; ++j) out += scores[j] * ({}){};", acc, load(vc, at(vc, "b", "kh", "j", "d")));
  s.line("{}", store(o, at(o, "b", "h", "i", "d"), "out / sum"));
  s.close();
  s.close();

  return {s.take(), {{k.name, grid_for(items, kBlock), kBlock, 0, {}}, {k.name + "_2", B * HQ * N, kBlock, 0, {}}}};
}

}  // namespace napkin::codegen::cuda::detail
