// The fused classifier as CUDA C (ir/loop.h's ClassifierParams): the row
// work between the chunk GEMMs, which the runtime runs on cuBLASLt
// (runtime/cuda/cuda_classifier.h). The vocabulary is walked in chunks of
// `chunk` classes (classifier_layout below), as the CPU runtime does
// (runtime/classifier.h), with a chunk large enough for the GEMMs to fill
// the GPU and small enough that its logits stay in L2 between the GEMM that
// writes them and the kernel that reads them.
//
// Scratch (byte offsets in CudaClassifierLayout): the chunk's logits, later
// its gradient g, [rows, chunk] in x's type; the running max, sum and target
// logit per row (f32; f64 for f64); backward, for 16-bit x, dx's f32 sums
// [rows, d].
//
// Launches, in the order the runtime interleaves them with its GEMMs:
//  forward   for each chunk c: GEMM logits = x w_cᵀ, then NAME_f<c> (grid
//            rows, 256 threads): the row's chunk max and sum of exp folded
//            into its running max and sum (online log-sum-exp, the CPU's
//            formula), the target's logit kept when it is in the chunk;
//            then NAME_loss (one block): lse per row, and the loss, summed
//            over rows in row order in double as the CPU does.
//  backward  for each chunk c: GEMM logits, then NAME_b<c> (grid rows, 256
//            threads): g = (exp(l - lse) - onehot) * dloss / rows rounded to
//            x's type, in place; then GEMM dw_c = gᵀ x, GEMM dx (+)= g w_c;
//            then, for 16-bit x, NAME_dx: dx = its f32 sums rounded.
//  The chunk's first class is a constant of its function's text, so each
//  chunk has its own function (the chunk count is small: a few dozen for
//  GPT-2).
// A target outside [0, vocab) is reported through NAPKIN_BAD_INDEX by the
// first forward chunk and counts 0 in the loss; the CPU runtime throws.
#include <fmt/format.h>

#include <algorithm>

#include "codegen/cuda/emit.h"
#include "codegen/cuda/kernel_source.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cuda {

namespace {

constexpr int64_t kChunkQuantum = 128;           // chunk sizes are multiples of this (GEMM tiles)
constexpr int kBlock = 256;

int64_t align256(int64_t n) { return (n + 255) / 256 * 256; }

}  // namespace

CudaClassifierLayout classifier_layout(const Kernel& k, const CudaSourceOptions& options) {
  const Operand& x = k.inputs[0];
  const Operand& w = k.inputs[1];
  const int64_t d = x.sizes.back(), rows = x.numel() / d, vocab = w.sizes[0];
  const int64_t es = ir::dtype_size(x.dtype), acc = detail::compute_size(x.dtype);
  CudaClassifierLayout l;
  l.rows = rows, l.vocab = vocab, l.d = d;
  l.chunk = std::max(kChunkQuantum, options.classifier_logits_bytes / (rows * es) / kChunkQuantum * kChunkQuantum);
  if (l.chunk >= vocab) l.chunk = vocab;
  l.chunks = (vocab + l.chunk - 1) / l.chunk;
  l.logits = 0;
  l.state = align256(rows * l.chunk * es);
  int64_t end = l.state + align256(3 * rows * acc);
  const bool wide = x.dtype == ir::DType::F32 || x.dtype == ir::DType::F64;
  if (k.classifier().backward && !wide) {
    l.dx_acc = end;
    end += align256(rows * d * 4);
  }
  l.scratch_bytes = end;
  return l;
}

namespace detail {

EmittedKernel emit_classifier(const Kernel& k, int index, const CudaClassifierLayout& l) {
  const Operand& x = k.inputs[0];
  const Operand& t = k.inputs[2];
  const bool backward = k.classifier().backward;
  NAPKIN_INTERNAL_CHECK(x.contiguous() && t.contiguous(), "classifier {}: x and the targets must be contiguous", k.name);
  const ir::DType xt = x.dtype;
  const std::string ct = compute_type(xt), st = storage_type(xt);
  const std::string it = index_type(l.rows * l.chunk + l.rows * l.d);
  auto lit = [&](double v) { return literal(xt, v); };

  EmittedKernel out;
  out.scratch_bytes = l.scratch_bytes;
  Src s;
  // The running state: max, sum, target logit, one per row.
  auto state = [&] {
    s.line("{0}* const run_max = ({0}*)(scratch + {1});", ct, l.state);
    s.line("{0}* const run_sum = run_max + {1};", ct, l.rows);
    s.line("{0}* const picked = run_sum + {1};", ct, l.rows);
  };
  for (int64_t c = 0; c < l.chunks; ++c) {
    const int64_t c0 = c * l.chunk, n = std::min(l.chunk, l.vocab - c0);
    const std::string name = fmt::format("{}_{}{}", k.name, backward ? 'b' : 'f', c);
    begin_kernel(s, name, kBlock);
    s.line("__shared__ {} red[32];", ct);
    s.line("const {} row = ({})blockIdx.x;", it, it);
    s.line("{0}* const l = ({0}*)(scratch + {1}) + row * {2}u;", st, l.logits, l.chunk);
    s.line("const long long tgt = (long long){};", load(t, "row"));
    if (!backward) {
      state();
      if (c == 0) s.line("if (threadIdx.x == 0u && (unsigned long long)tgt >= {}ull) NAPKIN_BAD_INDEX({}, tgt, {}LL);",
                         l.vocab, index, l.vocab);
      // m = max(running max, chunk max); sum = sum * exp(old - m) + sum_j exp(l_j - m)
      s.line("const {} ninf = -{};", ct, xt == ir::DType::F64 ? "napkin_inf_f64()" : "napkin_inf_f32()");
      s.line("{} m = {};", ct, c == 0 ? "ninf" : "run_max[row]");
      s.line("for (unsigned j = threadIdx.x; j < {}u; j += {}u) m = napkin_maxnum_op()(m, {});", n, kBlock,
             from_storage(xt, "l[j]"));
      s.line("m = napkin_block_reduce(m, napkin_maxnum_op(), ninf, red);");
      s.line("{} sum = {};", ct, lit(0.0));
      s.line("for (unsigned j = threadIdx.x; j < {}u; j += {}u) sum += napkin_exp({} - m);", n, kBlock,
             from_storage(xt, "l[j]"));
      s.line("sum = napkin_block_reduce(sum, napkin_sum_op(), {}, red);", lit(0.0));
      s.open("if (threadIdx.x == 0u) {{");
      if (c == 0) s.line("run_sum[row] = sum;");
      else s.line("run_sum[row] = run_sum[row] * napkin_exp(run_max[row] - m) + sum;");
      s.line("run_max[row] = m;");
      s.line("if (tgt >= {0}LL && tgt < {1}LL) picked[row] = {2};", c0, c0 + n, from_storage(xt, fmt::format("l[tgt - {}LL]", c0)));
      s.close();
    } else {
      const Operand& lse = k.inputs[3];
      const Operand& dloss = k.inputs[4];
      s.line("const {} scale = {} / {};", ct, load(dloss, "0"), lit(static_cast<double>(l.rows)));
      s.line("const {} lse = {};", ct, load(lse, "row"));
      s.open("for (unsigned j = threadIdx.x; j < {}u; j += {}u) {{", n, kBlock);
      s.line("const {} onehot = tgt == {}LL + (long long)j ? {} : {};", ct, c0, lit(1.0), lit(0.0));
      s.line("l[j] = {};", to_storage(xt, fmt::format("(napkin_exp({} - lse) - onehot) * scale", from_storage(xt, "l[j]"))));
      s.close();
    }
    s.close();
    out.launches.push_back({name, l.rows, kBlock, 0, {}});
  }
  if (!backward) {
    const Operand& lse = k.extra_outputs.at(0);
    const std::string name = k.name + "_loss";
    begin_kernel(s, name, 1024);
    state();
    s.line("__shared__ double red[32];");
    s.line("double acc = 0.0;");
    s.open("for (unsigned r = threadIdx.x; r < {}u; r += 1024u) {{", l.rows);
    s.line("const {} v = run_max[r] + napkin_log(run_sum[r]);", ct);
    s.line("{}", store(lse, "r", "v"));
    s.line("const long long tgt = (long long){};", load(t, "r"));
    s.line("if ((unsigned long long)tgt < {}ull) acc += (double)(v - picked[r]);", l.vocab);
    s.close();
    s.line("acc = napkin_block_reduce(acc, napkin_sum_op(), 0.0, red);");
    s.line("if (threadIdx.x == 0u) {}",
           store(k.output, "0", fmt::format("({})(acc / {})", compute_type(k.output.dtype),
                                            literal(ir::DType::F64, static_cast<double>(l.rows)))));
    s.close();
    out.launches.push_back({name, 1, 1024, 0, {}});
  } else if (l.dx_acc >= 0) {
    const std::string name = k.name + "_dx";
    const int64_t total = l.rows * l.d;
    begin_kernel(s, name, kBlock);
    s.line("const float* const acc = (const float*)(scratch + {});", l.dx_acc);
    s.line("for ({0} i = ({0})blockIdx.x * {1}u + threadIdx.x; i < {2}u; i += ({0})gridDim.x * {1}u) {3}", it, kBlock,
           total, store(k.output, "i", "acc[i]"));
    s.close();
    out.launches.push_back({name, grid_for(total, kBlock), kBlock, 0, {}});
  }
  out.text = s.take();
  return out;
}

}  // namespace detail

}  // namespace napkin::codegen::cuda
