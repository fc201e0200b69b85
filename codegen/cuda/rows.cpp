// Row kernels: softmax, log_softmax, layernorm, rmsnorm, cross-entropy and
// their gradients (a norm's with its gain's and bias's). A row is the elements along
// one axis; the loop runs over every other dim (as codegen/cpu/kernels.cpp
// `rows`), with the CPU backend's formulas, sums in the compute type.
//
// Terms (besides codegen/cuda/emit.h's):
//  - row group: the threads that share one row: a warp when the row has at
//    most 1024 elements (8 rows per 256-thread block), else a whole block
//    (256, 512 or 1024 threads). Row sums and maxima are warp butterflies or
//    block reductions (prelude), so their order is fixed by the launch.
//  - chunk slot: thread t of a group of T owns chunks t, t + T, ... of the
//    row; K = ceil(chunks / T) slots per thread.
//  - cached: when K * E <= 32 (and groups of at most 512 threads) the row's
//    full-shaped inputs are loaded once into registers (c<i>[K * E]) and the
//    passes (max, sum, write) reuse them; otherwise every pass reloads (from
//    L2: a row group's rows are in flight together).
//  - per-row / vector operands: cross-entropy targets (one per row), norm
//    gains and biases (one per row element, the same for every row).
//  - cross_entropy: launch 1 writes each row's loss to scratch, launch 2 (one
//    block) sums them in row order in double (as the CPU) into the mean.
//  - a norm's gradient with its gains': each thread sums dy * x_hat (and dy)
//    of its columns over its group's rows in registers, the groups of a
//    block add theirs in warp order through shared memory into the block's
//    partial in scratch, and a second launch adds the blocks' partials in
//    block order per column.
#include <algorithm>
#include <limits>

#include "codegen/cuda/emit.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cuda::detail {

namespace {

using ir::DType;
using ir::RowVariant;

// Emits one row kernel's body, pass by pass.
class RowEmitter {
 public:
  RowEmitter(Src& s, const std::vector<RowOperand>& ops, const std::vector<int64_t>& sizes, int64_t n)
      : s(s), ops(ops), sizes(sizes), n(n), xt(ops[0].op->dtype), ct(compute_type(xt)) {
    rows = product(sizes);
    warp = n <= 1024;
    T = warp ? 32 : n <= 4096 ? 256 : n <= 16384 ? 512 : 1024;
    // Chunks of E elements when every full-shaped operand is contiguous
    // along the row and 16-byte aligned at every row.
    int min_size = 16;
    bool vec = true;
    vec_ok.resize(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      const RowOperand& r = ops[i];
      vec_ok[i] = (r.shape == RowShape::Full || r.shape == RowShape::Vector) && r.step == 1 && aligned16(*r.op, r.strides);
      if (r.shape != RowShape::Full) continue;
      vec = vec && vec_ok[i];
      min_size = std::min(min_size, ir::dtype_size(r.op->dtype));
    }
    E = vec && n % (16 / min_size) == 0 ? 16 / min_size : 1;
    chunks = n / E;
    K = (chunks + T - 1) / T;
    cache = K * E <= 32 && T <= 512;
    rows_per_block = warp ? static_cast<int>(std::min<int64_t>(8, rows)) : 1;
    block = warp ? 32 * rows_per_block : T;
    grid = grid_for(rows, rows_per_block);
    int64_t bound = std::max<int64_t>(rows + grid * rows_per_block, chunks + T);
    for (const RowOperand& r : ops) bound = std::max(bound, max_offset(sizes, r.strides) + (n - 1) * r.step + 1);
    it = index_type(bound);
    cached_.assign(ops.size(), false);
  }

  Src& s;
  const std::vector<RowOperand>& ops;
  const std::vector<int64_t>& sizes;
  int64_t n, rows = 1, chunks = 1, grid = 1;
  DType xt;
  std::string ct, it;
  bool warp = true, cache = false;
  int T = 32, E = 1, K = 1, rows_per_block = 1, block = 32;
  std::vector<bool> vec_ok;

  std::string lit(double v) const { return literal(xt, v); }
  bool cached(int i) const { return cached_[i]; }
  // Operand i, element e of the current chunk.
  std::string val(int i, int e) const {
    return cached(i) ? fmt::format("c{}[j * {} + {}]", i, E, e) : fmt::format("t{}[{}]", i, e);
  }
  // Element index `k` (of the row) of operand i.
  std::string addr(int i, const std::string& k) const {
    int64_t step = ops[i].step;
    if (step == 0) return fmt::format("b{}", i);
    if (step == 1) return fmt::format("b{} + {}", i, k);
    return fmt::format("b{} + ({}) * {}u", i, k, step);
  }

  // The kernel's opening and its row loop (closed by end()); `before` emits
  // lines that run once per thread before the loop.
  void begin(const std::string& name, const std::function<void()>& before = {}) {
    begin_kernel(s, name, block);
    if (!warp) s.line("__shared__ {} red[32];", ct);
    s.line("const {} tt = threadIdx.x{};", it, warp ? " & 31u" : "");
    if (before) before();
    if (warp)
      s.open("for ({0} row = ({0})blockIdx.x * {1}u + (threadIdx.x >> 5); row < {2}u; row += ({0})gridDim.x * {1}u) {{", it,
             rows_per_block, rows);
    else
      s.open("for ({0} row = blockIdx.x; row < {1}u; row += gridDim.x) {{", it, rows);
    decompose(s, sizes, "row", "i", it);
    for (size_t i = 0; i < ops.size(); ++i) s.line("[[maybe_unused]] const {} b{} = {};", it, i, dot("i", ops[i].strides));
  }
  // Closes the row loop, emits `after` (once per thread, after every row), closes the kernel.
  void end(const std::function<void()>& after = {}) {
    s.close();
    if (after) after();
    s.close();
  }

  void load_chunk(int i, const std::function<std::string(int)>& dst) {
    if (E > 1 && vec_ok[i]) {
      vector_load(s, *ops[i].op, addr(i, "k0"), E, dst);
      return;
    }
    for (int e = 0; e < E; ++e) s.line("{} = {};", dst(e), load(*ops[i].op, addr(i, e ? fmt::format("(k0 + {}u)", e) : "k0")));
  }

  void open_chunks() {
    s.open("{}for (int j = 0; j < {}; ++j) {{", cache ? "NAPKIN_UNROLL " : "", K);
    s.line("const {} c = tt + ({})j * {}u;", it, it, T);
    s.open("if (c < {}u) {{", chunks);
    s.line("[[maybe_unused]] const {} k0 = c * {}u;", it, E);
  }
  void close_chunks() {
    s.close();
    s.close();
  }

  // Loads the full-shaped inputs among `use` into registers, when caching.
  void load_cache(const std::vector<int>& use) {
    if (!cache) return;
    std::vector<int> cached_ops;
    for (int i : use) {
      if (ops[i].shape != RowShape::Full || !ops[i].input) continue;
      cached_[i] = true;
      cached_ops.push_back(i);
      s.line("{} c{}[{}];", compute_type(ops[i].op->dtype), i, K * E);
    }
    open_chunks();
    for (int i : cached_ops) load_chunk(i, [&](int e) { return fmt::format("c{}[j * {} + {}]", i, E, e); });
    close_chunks();
  }

  // A pass over this thread's chunks: loads the `need`ed operands that are
  // not cached, runs body(e) per element, then stores ov[] to operand
  // `store_to` (if >= 0).
  void pass(const std::vector<int>& need, const std::function<void(int)>& body, int store_to = -1) {
    open_chunks();
    for (int i : need) {
      if (cached(i)) continue;
      s.line("{} t{}[{}];", compute_type(ops[i].op->dtype), i, E);
      load_chunk(i, [&](int e) { return fmt::format("t{}[{}]", i, e); });
    }
    if (store_to >= 0) s.line("{} ov[{}];", compute_type(ops[store_to].op->dtype), E);
    for (int e = 0; e < E; ++e) body(e);
    if (store_to >= 0) {
      if (E > 1 && vec_ok[store_to]) {
        vector_store(s, *ops[store_to].op, addr(store_to, "k0"), E, [](int e) { return fmt::format("ov[{}]", e); });
      } else {
        for (int e = 0; e < E; ++e)
          s.line("{}", store(*ops[store_to].op, addr(store_to, e ? fmt::format("(k0 + {}u)", e) : "k0"), fmt::format("ov[{}]", e)));
      }
    }
    close_chunks();
  }

  void reduce(const std::string& var, const std::string& op, const std::string& identity) {
    if (warp) s.line("{0} = napkin_warp_reduce({0}, {1});", var, op);
    else s.line("{0} = napkin_block_reduce({0}, {1}, {2}, red);", var, op, identity);
  }

  // sum over the row of body's `acc += ...` terms into `var`.
  void row_sum(const std::string& var, const std::vector<int>& need, const std::function<std::string(int)>& term) {
    s.line("{} {} = {};", ct, var, lit(0.0));
    pass(need, [&](int e) { s.line("{} += {};", var, term(e)); });
    reduce(var, "napkin_sum_op()", lit(0.0));
  }

  // mean (0 when not centered) and rstd = 1 / sqrt(mean((x - mean)^2) + eps).
  void row_stats(double eps, bool centered) {
    std::string inv_n = lit(1.0 / static_cast<double>(n));
    if (centered) {
      row_sum("mean", {0}, [&](int e) { return val(0, e); });
      s.line("mean = mean * {};", inv_n);
    } else {
      s.line("const {} mean = {};", ct, lit(0.0));
    }
    s.line("{} ss = {};", ct, lit(0.0));
    pass({0}, [&](int e) { s.line("{{ const {} d = {} - mean; ss += d * d; }}", ct, val(0, e)); });
    reduce("ss", "napkin_sum_op()", lit(0.0));
    s.line("const {0} rstd = {1} / napkin_sqrt(ss * {2} + {3});", ct, lit(1.0), inv_n, lit(eps));
  }

  // m = max, sum = sum exp(x - m) over the row. From registers: two passes,
  // the CPU's formula. Streaming (a vocabulary-long row): one pass over
  // memory, each thread keeping its own max and its sum scaled to it
  // (online softmax), then sum = sum over threads of sum_t exp(m_t - m).
  void softmax_stats() {
    std::string minus_inf = lit(-std::numeric_limits<double>::infinity());
    s.line("{} m = {};", ct, minus_inf);
    if (cache) {
      pass({0}, [&](int e) { s.line("m = napkin_maxnum(m, {});", val(0, e)); });
      reduce("m", "napkin_maxnum_op()", minus_inf);
      row_sum("sum", {0}, [&](int e) { return fmt::format("napkin_exp({} - m)", val(0, e)); });
      return;
    }
    s.line("{} sum = {};", ct, lit(0.0));
    pass({0}, [&](int e) {
      s.open("{{");
      s.line("const {} x = {};", ct, val(0, e));
      s.line("if (x > m) sum = sum * napkin_exp(m - x) + {}, m = x;", lit(1.0));
      s.line("else sum += napkin_exp(x - m);");
      s.close();
    });
    s.line("const {} m_thread = m;", ct);
    reduce("m", "napkin_maxnum_op()", minus_inf);
    s.line("sum = sum * napkin_exp(m_thread - m);");
    reduce("sum", "napkin_sum_op()", lit(0.0));
  }

  std::string elem(int e) const { return e ? fmt::format("(long long)(k0 + {}u)", e) : "(long long)k0"; }

 private:
  std::vector<bool> cached_;  // by load_cache
};

}  // namespace

EmittedKernel emit_rows(const Kernel& k, int index) {
  const Operand& x = k.inputs[0];
  const ir::RowParams& p = k.rows();
  const RowLoop loop = row_loop(k);
  const std::vector<RowOperand>& ops = loop.operands;
  const std::vector<int64_t>& sizes = loop.sizes;
  const int64_t n = loop.n;

  EmittedKernel out;
  Src s;
  RowEmitter r(s, ops, sizes, n);
  const std::string& ct = r.ct;
  // A norm's gradient with its gains' (gain, then bias, after dx: row_loop)
  // sums them over rows: each row group in registers, the groups of a block
  // in warp order through shared memory, each block's partial to scratch,
  // then a second launch adds the blocks' partials in block order per column.
  const bool gains = p.variant == RowVariant::NormGrad && p.gains;
  // A norm's gradient may add the residual stream's (operand 3) as it stores dx.
  const int residual = p.variant == RowVariant::NormGrad && k.inputs.size() > 3 ? 1 : 0;
  const int o = gains ? 3 + residual : static_cast<int>(ops.size()) - 1;  // the output operand (not for CrossEntropy)
  const int gi = o + 1;  // the gain's gradient (then the bias's), with the gains
  const double eps = p.eps;
  std::string inv_n = r.lit(1.0 / static_cast<double>(n));
  const int slots = r.K * r.E;
  if (gains) {
    NAPKIN_INTERNAL_CHECK(slots <= 64, "{}: a row of {} elements leaves {} gain sums per thread (at most 64)", k.name, n, slots);
    r.grid = std::min<int64_t>(r.grid, kSMs * 2);  // few blocks: few partials
  }
  const std::string partials = fmt::format("(({}*)scratch)", ct);
  auto declare_gains = [&] {
    if (!gains) return;
    s.line("{0} ag[{1}], ab[{1}];", ct, slots);
    s.line("for (int q = 0; q < {}; ++q) ag[q] = ab[q] = {};", slots, r.lit(0.0));
  };
  // Each thread's sums for column col = (tt + j * T) * E + e of slot j * E + e.
  auto for_each_slot = [&](const std::function<void(const std::string& col, const std::string& slot)>& body) {
    s.open("for (int j = 0; j < {}; ++j) {{", r.K);
    s.line("const {} c = tt + ({})j * {}u;", r.it, r.it, r.T);
    s.open("if (c < {}u) {{", r.chunks);
    for (int e = 0; e < r.E; ++e) body(fmt::format("(c * {}u + {}u)", r.E, e), fmt::format("j * {} + {}", r.E, e));
    s.close();
    s.close();
  };
  auto store_gains = [&] {
    if (!gains) return;
    if (r.warp) {
      s.line("__shared__ {} part[{}];", ct, 2 * n);
      s.line("for ({0} q = threadIdx.x; q < {1}u; q += {2}u) part[q] = {3};", r.it, 2 * n, r.block, r.lit(0.0));
      s.line("__syncthreads();");
      s.open("for (int w = 0; w < {}; ++w) {{", r.rows_per_block);
      s.open("if ((int)(threadIdx.x >> 5) == w) {{");
      for_each_slot([&](const std::string& col, const std::string& slot) {
        s.line("part[{}] += ag[{}];", col, slot);
        s.line("part[{}u + {}] += ab[{}];", n, col, slot);
      });
      s.close();
      s.line("__syncthreads();");
      s.close();
      s.line("for ({0} q = threadIdx.x; q < {1}u; q += {2}u) {3}[({0})blockIdx.x * {1}u + q] = part[q];", r.it, 2 * n, r.block,
             partials);
    } else {
      for_each_slot([&](const std::string& col, const std::string& slot) {
        s.line("{}[({})blockIdx.x * {}u + {}] = ag[{}];", partials, r.it, 2 * n, col, slot);
        s.line("{}[({})blockIdx.x * {}u + {}u + {}] = ab[{}];", partials, r.it, 2 * n, n, col, slot);
      });
    }
  };
  r.begin(k.name, declare_gains);
  const bool loss = p.variant == RowVariant::CrossEntropy;
  if (loss || p.variant == RowVariant::CrossEntropyGrad) {
    s.line("const long long tgt = (long long){};", load(*ops[1].op, "b1"));
    s.open("if ((unsigned long long)tgt >= {}ull) {{", n);
    s.line("if (tt == 0u) NAPKIN_BAD_INDEX({}, tgt, {}LL);", index, n);
    if (loss) s.line("if (tt == 0u) (({}*)scratch)[row] = {};", ct, r.lit(0.0));
    s.line("continue;");
    s.close();
  }
  std::vector<int> inputs;
  for (int i = 0; i < o; ++i) inputs.push_back(i);
  r.load_cache(inputs);
  switch (p.variant) {
    case RowVariant::Softmax:
      r.softmax_stats();
      s.line("const {} inv = {} / sum;", ct, r.lit(1.0));
      r.pass({0}, [&](int e) { s.line("ov[{}] = napkin_exp({} - m) * inv;", e, r.val(0, e)); }, o);
      break;
    case RowVariant::LogSoftmax:
      r.softmax_stats();
      s.line("const {} shift = m + napkin_log(sum);", ct);
      r.pass({0}, [&](int e) { s.line("ov[{}] = {} - shift;", e, r.val(0, e)); }, o);
      break;
    case RowVariant::CrossEntropy:
      // -log softmax(x)[t] = log(sum) + m - x[t]
      r.softmax_stats();
      s.line("if (tt == 0u) (({}*)scratch)[row] = (napkin_log(sum) + m) - {};", ct, load(x, r.addr(0, "(" + r.it + ")tgt")));
      break;
    case RowVariant::CrossEntropyGrad: {
      // (softmax - onehot) * dloss / rows
      r.softmax_stats();
      s.line("const {} scale = {} * {};", ct, load(k.inputs[2], "0"), r.lit(1.0 / static_cast<double>(r.rows)));
      s.line("const {} inv = ({} / sum) * scale;", ct, r.lit(1.0));
      DType od = ops[o].op->dtype;
      r.pass({0}, [&](int e) {
        s.open("{{");
        s.line("{} v = napkin_exp({} - m) * inv;", ct, r.val(0, e));
        s.line("if ({} == tgt) v = {} - scale;", r.elem(e), as_stored(od, "v"));
        s.line("ov[{}] = v;", e);
        s.close();
      }, o);
      break;
    }
    case RowVariant::SoftmaxGrad:  // y * (dy - sum(dy * y))
      r.row_sum("dot", {0, 1}, [&](int e) { return fmt::format("{} * {}", r.val(0, e), r.val(1, e)); });
      r.pass({0, 1}, [&](int e) { s.line("ov[{}] = {} * ({} - dot);", e, r.val(0, e), r.val(1, e)); }, o);
      break;
    case RowVariant::Norm: {
      r.row_stats(eps, p.centered);
      std::vector<int> need = p.centered ? std::vector<int>{0, 1, 2} : std::vector<int>{0, 1};
      r.pass(need, [&](int e) {
        std::string y = fmt::format("(({} - mean) * rstd) * {}", r.val(0, e), r.val(1, e));
        if (p.centered) y = fmt::format("{} + {}", y, r.val(2, e));
        s.line("ov[{}] = {};", e, y);
      }, o);
      break;
    }
    case RowVariant::NormGrad: {
      const std::vector<int> dx_needs = residual ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0, 1, 2};
      auto plus_residual = [&](int e) { return residual ? fmt::format(" + {}", r.val(3, e)) : std::string(); };
      // With the gains: each thread sums dy * x_hat (and dy) of its columns
      // over the rows its group runs, in ag[] (ab[]), declared before the row loop.
      auto gains = [&](int e, const std::string& xhat) {
        if (!p.gains) return;
        s.line("ag[j * {0} + {1}] += {2} * ({3});", r.E, e, r.val(2, e), xhat);
        if (p.centered) s.line("ab[j * {0} + {1}] += {2};", r.E, e, r.val(2, e));
      };
      if (!p.centered) {
        // dx = rstd * (g_dy - x * rstd^2 * mean(g_dy * x))
        r.row_stats(eps, false);
        r.row_sum("s1", {0, 1, 2}, [&](int e) { return fmt::format("({} * {}) * {}", r.val(2, e), r.val(1, e), r.val(0, e)); });
        s.line("const {} coef = (rstd * rstd) * (s1 * {});", ct, inv_n);
        r.pass(dx_needs, [&](int e) {
          s.line("ov[{}] = rstd * ({} * {} - {} * coef){};", e, r.val(2, e), r.val(1, e), r.val(0, e), plus_residual(e));
          gains(e, fmt::format("{} * rstd", r.val(0, e)));
        }, o);
        break;
      }
      // dx = rstd * (g_dy - mean(g_dy) - x_hat * mean(g_dy * x_hat)), g_dy = dy * g
      r.row_stats(eps, true);
      s.line("{0} s1 = {1}, s2 = {1};", ct, r.lit(0.0));
      auto terms = [&](int e) {
        s.line("const {} gdy{} = {} * {};", ct, e, r.val(2, e), r.val(1, e));
        s.line("const {} xhat{} = ({} - mean) * rstd;", ct, e, r.val(0, e));
      };
      r.pass({0, 1, 2}, [&](int e) {
        terms(e);
        s.line("s1 += gdy{};", e);
        s.line("s2 += gdy{0} * xhat{0};", e);
      });
      r.reduce("s1", "napkin_sum_op()", r.lit(0.0));
      r.reduce("s2", "napkin_sum_op()", r.lit(0.0));
      s.line("const {} mean_gdy = s1 * {}, mean_gdy_xhat = s2 * {};", ct, inv_n, inv_n);
      r.pass(dx_needs, [&](int e) {
        terms(e);
        s.line("ov[{0}] = rstd * ((gdy{0} - mean_gdy) - xhat{0} * mean_gdy_xhat){1};", e, plus_residual(e));
        gains(e, fmt::format("xhat{}", e));
      }, o);
      break;
    }
  }
  r.end(store_gains);
  out.launches.push_back({k.name, r.grid, r.block, 0, {}});
  if (gains) {
    // A warp per column adds the blocks' partials (lanes over blocks, then the butterfly: a fixed order).
    const std::string name2 = k.name + "_2";
    const int block2 = static_cast<int>(std::min<int64_t>(256, n * 32));
    begin_kernel(s, name2, block2);
    s.open("for ({0} col = ({0})blockIdx.x * {1}u + (threadIdx.x >> 5); col < {2}u; col += ({0})gridDim.x * {1}u) {{", r.it,
           block2 / 32, n);
    s.line("{0} acc = {1}, accb = {1};", ct, r.lit(0.0));
    s.line("for ({0} q = threadIdx.x & 31u; q < {1}u; q += 32u) acc += {2}[q * {3}u + col];", r.it, r.grid, partials, 2 * n);
    s.line("acc = napkin_warp_reduce(acc, napkin_sum_op());");
    s.line("[[maybe_unused]] const {} b{} = 0u;", r.it, gi);
    s.line("if ((threadIdx.x & 31u) == 0u) {}", store(*ops[gi].op, r.addr(gi, "col"), "acc"));
    if (p.centered) {
      s.line("for ({0} q = threadIdx.x & 31u; q < {1}u; q += 32u) accb += {2}[q * {3}u + {4}u + col];", r.it, r.grid, partials,
             2 * n, n);
      s.line("accb = napkin_warp_reduce(accb, napkin_sum_op());");
      s.line("[[maybe_unused]] const {} b{} = 0u;", r.it, gi + 1);
      s.line("if ((threadIdx.x & 31u) == 0u) {}", store(*ops[gi + 1].op, r.addr(gi + 1, "col"), "accb"));
    }
    s.close();
    s.close();
    out.launches.push_back({name2, grid_for(n, block2 / 32), block2, 0, {}});
    out.scratch_bytes = r.grid * 2 * n * compute_size(x.dtype);
  }
  if (loss) {
    std::string name2 = k.name + "_2";
    begin_kernel(s, name2, 1024);
    s.line("__shared__ double red[32];");
    s.line("double acc = 0.0;");
    s.line("for (unsigned q = threadIdx.x; q < {}u; q += 1024u) acc += (double)(({}*)scratch)[q];", r.rows, ct);
    s.line("acc = napkin_block_reduce(acc, napkin_sum_op(), 0.0, red);");
    s.line("if (threadIdx.x == 0u) {}", store(k.output, "0", fmt::format("({})(acc / {})", ct, literal(DType::F64, static_cast<double>(r.rows)))));
    s.close();
    out.launches.push_back({name2, 1, 1024, 0, {}});
    out.scratch_bytes = r.rows * compute_size(x.dtype);
  }
  out.text = s.take();
  return out;
}

}  // namespace napkin::codegen::cuda::detail
