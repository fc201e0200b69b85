// Reductions in a fixed order: reduce_sum/mean/max/min, mse, and the
// embedding gradient. No atomics: where one launch cannot combine the parts
// of a sum deterministically, partial results go through `scratch` and a
// second launch combines them in index order.
//
// Terms:
//  - kept dims / reduced dims: of the (collapsed) input loop, those with a
//    nonzero output stride and those summed away.
//  - row reduction: the innermost input dim is reduced; a warp (or, for few
//    long rows, several blocks, each a split of the row) runs along it.
//  - column reduction: the innermost dim is kept; consecutive threads own
//    consecutive outputs (coalesced) and each runs down a split of the
//    reduced elements.
//  - split: a contiguous range of an output's reduced elements; S splits give
//    S partials per output in scratch, combined by the second launch in split
//    order.
#include <algorithm>
#include <limits>

#include "codegen/cuda/emit.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cuda::detail {

namespace {

using ir::DType;

// Threads that keep every SM's memory pipes busy.
constexpr int64_t kFullThreads = kSMs * 2048;
// Ids each thread of an embedding-gradient block checks per chunk.
constexpr int kIdsPerThread = 4;

}  // namespace

Combine combine_of(ir::Combiner c, DType t) {
  bool fp = ir::is_floating(t);
  switch (c) {
    case ir::Combiner::Sum: break;
    case ir::Combiner::Max:
      if (fp) return {"napkin_max_op()", literal(t, -std::numeric_limits<double>::infinity())};
      return {"napkin_max_op()", t == DType::I32 ? "(-2147483647 - 1)" : "(-9223372036854775807LL - 1)"};
    case ir::Combiner::Min:
      if (fp) return {"napkin_min_op()", literal(t, std::numeric_limits<double>::infinity())};
      return {"napkin_min_op()", t == DType::I32 ? "2147483647" : "9223372036854775807LL"};
  }
  return {"napkin_sum_op()", literal(t, 0.0)};
}

EmittedKernel emit_reduction(const Kernel& k) {
  const Operand& out = k.output;
  const ReductionLoop loop = reduction_loop(k);
  const std::vector<int64_t>& sizes = loop.sizes;
  const std::vector<int64_t>& out_strides = loop.out_strides;
  // Per input (a plain reduction has one; a fused one each kernel input):
  // its strides over the kept and the reduced dims.
  // Likewise for each prologue result a fused reduction stores.
  const size_t n_in = loop.inputs.size(), n_st = loop.stores.size();
  std::vector<int64_t> kept_sizes, kept_out, red_sizes;
  std::vector<std::vector<int64_t>> kept_in(n_in), red_in(n_in), kept_st(n_st), red_st(n_st);
  for (size_t d = 0; d < sizes.size(); ++d) {
    const bool keep = out_strides[d] != 0;
    (keep ? kept_sizes : red_sizes).push_back(sizes[d]);
    if (keep) kept_out.push_back(out_strides[d]);
    for (size_t i = 0; i < n_in; ++i) (keep ? kept_in : red_in)[i].push_back(loop.inputs[i][d]);
    for (size_t j = 0; j < n_st; ++j) (keep ? kept_st : red_st)[j].push_back(loop.stores[j][d]);
  }
  if (kept_sizes.empty()) {
    kept_sizes = {1}, kept_out = {0};
    for (auto& s : kept_in) s = {0};
    for (auto& s : kept_st) s = {0};
  }
  if (red_sizes.empty()) {
    red_sizes = {1};
    for (auto& s : red_in) s = {0};
    for (auto& s : red_st) s = {0};
  }
  const int64_t M = product(kept_sizes), R = product(red_sizes);
  const bool row = out_strides.back() == 0 && sizes.back() > 1;
  const char* ct = compute_type(out.dtype);
  const Combine c = combine_of(k.reduction().combiner, out.dtype);
  auto finalize = [&](const std::string& acc) {
    if (!k.reduction().mean) return acc;
    return fmt::format("({} / {})", acc, literal(out.dtype, static_cast<double>(product(sizes)) / static_cast<double>(std::max<int64_t>(M, 1))));
  };
  // The element at the kept index o and reduced index r, in out's compute
  // type: input 0 loaded, or the fused prologue computed from every input
  // (its stored results in s0, s1, ...).
  const std::string prologue = k.name + "_prologue";
  auto element = [&]() {
    if (!k.fused) return convert(load(k.inputs[0], fmt::format("base0 + {}", dot("r", red_in[0]))), k.inputs[0].dtype, out.dtype);
    std::vector<std::string> args;
    for (size_t i = 0; i < n_in; ++i) args.push_back(load(k.inputs[i], fmt::format("base{} + {}", i, dot("r", red_in[i]))));
    for (size_t j = 0; j < n_st; ++j) args.push_back(fmt::format("s{}", j));
    const FusedOp& reduce = k.fused->ops.back();
    const FusedArg reduced = reduce.args[0];
    return convert(fmt::format("{}({})", prologue, fmt::join(args, ", ")),
                   reduced.input ? k.inputs[reduced.index].dtype : k.fused->ops[reduced.index].dtype,
                   out.dtype);
  };
  // Folds the element at (o, r) into acc; a fused reduction also stores the
  // prologue results it keeps there (each element is visited once).
  auto accumulate = [&](Src& s, const std::string& op) {
    if (n_st == 0) {
      s.line("acc = {}(acc, {});", op, element());
      return;
    }
    s.open("{{");
    for (size_t j = 0; j < n_st; ++j) s.line("{} s{};", compute_type(k.fused->outputs[j + 1].dtype), j);
    s.line("acc = {}(acc, {});", op, element());
    for (size_t j = 0; j < n_st; ++j)
      s.line("{}", store(k.fused->outputs[j + 1], fmt::format("sbase{} + {}", j, dot("r", red_st[j])), fmt::format("s{}", j)));
    s.close();
  };

  // Splits: enough work items to fill the GPU, each split at least a few
  // thousand (row) or a few dozen (column) elements long.
  int64_t S = 1;
  if (row && M < kSMs * 8) S = std::clamp<int64_t>((kSMs * 4 + M - 1) / M, 1, (R + 2047) / 2048);
  if (!row) S = std::clamp<int64_t>((kFullThreads + M - 1) / M, 1, (R + 31) / 32);
  const int64_t chunk = (R + S - 1) / S;
  int64_t bound = std::max({M * S + kMaxGrid * 256, product(sizes), out.numel()});
  for (const auto& in : loop.inputs) bound = std::max(bound, max_offset(sizes, in) + 1);
  for (const auto& st : loop.stores) bound = std::max(bound, max_offset(sizes, st) + 1);
  std::string it = index_type(bound);

  EmittedKernel e;
  Src s;
  if (k.fused) s.line("{}", fused_prologue(k, prologue));
  // Each input's element index at the kept index o: base0, base1, ...
  auto declare_bases = [&]() {
    for (size_t i = 0; i < n_in; ++i) s.line("const {} base{} = {};", it, i, dot("o", kept_in[i]));
    for (size_t j = 0; j < n_st; ++j) s.line("const {} sbase{} = {};", it, j, dot("o", kept_st[j]));
  };
  const std::string partial_ptr = fmt::format("(({}*)scratch)", ct);
  // Writes acc for output o (and split sp when S > 1).
  auto emit_result = [&](const std::string& o, const std::string& sp, const std::string& acc) {
    if (S > 1) {
      s.line("{}[{}] = {};", partial_ptr, row ? fmt::format("{} * {}u + {}", o, S, sp) : fmt::format("{} * {}u + {}", sp, M, o), acc);
    } else {
      s.line("{}", store(out, dot("o", kept_out), finalize(acc)));
    }
  };
  if (row && S == 1) {
    // One warp per output, lanes along the row.
    int block = static_cast<int>(std::min<int64_t>(256, M * 32));
    int warps = block / 32;
    int64_t grid = grid_for(M, warps);
    begin_kernel(s, k.name, block);
    s.open("for ({0} q = ({0})blockIdx.x * {1}u + (threadIdx.x >> 5); q < {2}u; q += ({0})gridDim.x * {1}u) {{", it, warps, M);
    decompose(s, kept_sizes, "q", "o", it);
    declare_bases();
    s.line("{} acc = {};", ct, c.identity);
    s.open("for ({0} t = threadIdx.x & 31u; t < {1}u; t += 32u) {{", it, R);
    decompose(s, red_sizes, "t", "r", it);
    accumulate(s, c.op);
    s.close();
    s.line("acc = napkin_warp_reduce(acc, {});", c.op);
    s.line("if ((threadIdx.x & 31u) == 0u) {}", store(out, dot("o", kept_out), finalize("acc")));
    s.close();
    s.close();
    e.launches.push_back({k.name, grid, block, 0, {}});
  } else if (row) {
    // A block per (output, split); S > 1 here.
    const int block = 256;
    begin_kernel(s, k.name, block);
    s.line("__shared__ {} red[32];", ct);
    s.open("for ({0} w = blockIdx.x; w < {1}u; w += gridDim.x) {{", it, M * S);
    s.line("const {} q = w / {}u, sp = w % {}u;", it, S, S);
    decompose(s, kept_sizes, "q", "o", it);
    declare_bases();
    s.line("{} acc = {};", ct, c.identity);
    s.line("const {} end = sp * {}u + {}u < {}u ? sp * {}u + {}u : {}u;", it, chunk, chunk, R, chunk, chunk, R);
    s.open("for ({} t = sp * {}u + threadIdx.x; t < end; t += {}u) {{", it, chunk, block);
    decompose(s, red_sizes, "t", "r", it);
    accumulate(s, c.op);
    s.close();
    s.line("acc = napkin_block_reduce(acc, {}, {}, red);", c.op, c.identity);
    s.line("if (threadIdx.x == 0u) {}[q * {}u + sp] = acc;", partial_ptr, S);
    s.close();
    s.close();
    e.launches.push_back({k.name, grid_for(M * S, 1), block, 0, {}});
  } else {
    // Column reduction: thread (split, output), outputs fastest.
    int64_t items = M * S;
    int block = block_for(items);
    int64_t grid = grid_for(items, block);
    begin_kernel(s, k.name, block);
    s.open("for ({0} w = ({0})blockIdx.x * blockDim.x + threadIdx.x; w < {1}u; w += ({0})gridDim.x * blockDim.x) {{", it, items);
    s.line("const {} q = w % {}u, sp = w / {}u;", it, M, M);
    decompose(s, kept_sizes, "q", "o", it);
    declare_bases();
    s.line("{} acc = {};", ct, c.identity);
    s.line("const {} end = sp * {}u + {}u < {}u ? sp * {}u + {}u : {}u;", it, chunk, chunk, R, chunk, chunk, R);
    s.open("for ({} t = sp * {}u; t < end; ++t) {{", it, chunk);
    decompose(s, red_sizes, "t", "r", it);
    accumulate(s, c.op);
    s.close();
    emit_result("q", "sp", "acc");
    s.close();
    s.close();
    e.launches.push_back({k.name, grid, block, 0, {}});
  }
  if (S > 1) {
    // Second launch: a warp per output adds its S partials (lanes over the
    // splits, then the butterfly: a fixed order).
    std::string name2 = k.name + "_2";
    e.scratch_bytes = M * S * compute_size(out.dtype);
    std::string partial = row ? fmt::format("q * {}u + sp", S) : fmt::format("sp * {}u + q", M);
    int block = static_cast<int>(std::min<int64_t>(256, M * 32));
    int warps = block / 32;
    begin_kernel(s, name2, block);
    s.open("for ({0} q = ({0})blockIdx.x * {1}u + (threadIdx.x >> 5); q < {2}u; q += ({0})gridDim.x * {1}u) {{", it, warps, M);
    decompose(s, kept_sizes, "q", "o", it);
    s.line("{} acc = {};", ct, c.identity);
    s.line("for ({} sp = threadIdx.x & 31u; sp < {}u; sp += 32u) acc = {}(acc, {}[{}]);", it, S, c.op, partial_ptr, partial);
    s.line("acc = napkin_warp_reduce(acc, {});", c.op);
    s.line("if ((threadIdx.x & 31u) == 0u) {}", store(out, dot("o", kept_out), finalize("acc")));
    s.close();
    s.close();
    e.launches.push_back({name2, grid_for(M, warps), block, 0, {}});
  }
  e.text = s.take();
  return e;
}

// mse(a, b) = mean((a - b)^2): blocks sum squared differences (per thread in
// double, then the block's tree) into scratch; one block sums those partials.
EmittedKernel emit_mse(const Kernel& k) {
  const Operand& a = k.inputs[0];
  const Operand& b = k.inputs[1];
  std::vector<int64_t> sizes = a.sizes, sa = a.strides, sb = broadcast_strides(b, a.sizes);
  if (sizes.empty()) sizes = {1}, sa = {0}, sb = {0};
  collapse_dims(sizes, {&sa, &sb});
  int64_t n = product(sizes);
  const int block = 256;
  int64_t grid = grid_for(n, block * 8, kSMs * 4);
  std::string it = index_type(std::max({n + grid * block, max_offset(sizes, sa) + 1, max_offset(sizes, sb) + 1}));
  const char* ct = compute_type(a.dtype);
  Src s;
  begin_kernel(s, k.name, block);
  s.line("__shared__ double red[32];");
  s.line("double acc = 0.0;");
  s.open("for ({0} t = ({0})blockIdx.x * blockDim.x + threadIdx.x; t < {1}u; t += ({0})gridDim.x * blockDim.x) {{", it, n);
  decompose(s, sizes, "t", "i", it);
  s.line("const {} d = {} - {};", ct, load(a, dot("i", sa)), load(b, dot("i", sb)));
  s.line("acc += (double)(d * d);");
  s.close();
  s.line("acc = napkin_block_reduce(acc, napkin_sum_op(), 0.0, red);");
  s.line("if (threadIdx.x == 0u) ((double*)scratch)[blockIdx.x] = acc;");
  s.close();
  std::string name2 = k.name + "_2";
  begin_kernel(s, name2, block);
  s.line("__shared__ double red[32];");
  s.line("double acc = 0.0;");
  s.line("for (unsigned t = threadIdx.x; t < {}u; t += {}u) acc += ((const double*)scratch)[t];", grid, block);
  s.line("acc = napkin_block_reduce(acc, napkin_sum_op(), 0.0, red);");
  s.line("if (threadIdx.x == 0u) {}", store(k.output, "0", fmt::format("({})(acc / {})", ct, literal(DType::F64, static_cast<double>(a.numel())))));
  s.close();
  return {s.take(), {{k.name, grid, block, 0, {}}, {name2, 1, block, 0, {}}}, grid * 8};
}

// out[id] += dy[position] over positions in order, deterministic and equal to
// the CPU's serial loop: each block owns a contiguous range of vocabulary rows,
// zero-fills them, then scans every id in position order, a chunk (block size
// x kIdsPerThread ids) at a time: the ids of the chunk that fall in its range
// are listed in order (a prefix sum in shared memory), and for each listed
// position the block adds the dy row to the out row, thread c % blockDim
// owning column c, so every out element gets its additions in position order
// from one thread.
EmittedKernel emit_embedding_grad(const Kernel& k, int index) {
  const Operand& dy = k.inputs[0];
  const Operand& ids = k.inputs[1];
  const Operand& out = k.output;
  const auto [vocab, id_sizes, id_strides, dy_id_strides, row_sizes, row_out, row_dy] = embedding_loop(k);
  const int64_t positions = product(id_sizes), row_len = product(row_sizes);
  const int block = 256;
  int64_t grid = std::min<int64_t>(vocab, kSMs * 4);
  const int64_t rows_per_block = (vocab + grid - 1) / grid;
  grid = (vocab + rows_per_block - 1) / rows_per_block;
  std::string it = index_type(std::max({out.numel(), dy.numel(), max_offset(id_sizes, id_strides) + 1, positions + block * kIdsPerThread}));
  Src s;
  begin_kernel(s, k.name, block);
  s.line("__shared__ unsigned flags[{}];", block);
  s.line("__shared__ {} list_dy[{}];", it, block * kIdsPerThread);
  s.line("__shared__ {} list_row[{}];", it, block * kIdsPerThread);
  s.line("const {} v0 = ({})blockIdx.x * {}u;", it, it, rows_per_block);
  s.line("const {0} v1 = v0 + {1}u < {2}u ? v0 + {1}u : {2}u;", it, rows_per_block, vocab);
  // The block's rows start as zeros, or as the base's (whole, contiguous, of out's shape); nothing to
  // do where the memory plan gave out the base's buffer (the rows are added into in place).
  const Operand* base = k.inputs.size() == 3 ? &k.inputs[2] : nullptr;
  NAPKIN_INTERNAL_CHECK(!base || (base->contiguous() && out.contiguous() && base->sizes == out.sizes),
                        "embedding_grad's base ({}) is not a contiguous value of its result's shape", k.name);
  if (!base || base->byte_offset != out.byte_offset) {
    s.open("for ({} z = threadIdx.x; z < (v1 - v0) * {}u; z += {}u) {{", it, row_len, block);
    s.line("const {} row = v0 + z / {}u, c = z % {}u;", it, row_len, row_len);
    decompose(s, row_sizes, "c", "r", it);
    const std::string at = fmt::format("row * {}u + {}", out.strides[0], dot("r", row_out));
    s.line("{}", store(out, at, base ? load(*base, at) : literal(out.dtype, 0.0)));
    s.close();
  }
  // A chunk is kIdsPerThread ids per thread: thread t checks positions
  // chunk + kIdsPerThread * t + q, so listing by thread keeps position order.
  const int per_chunk = block * kIdsPerThread;
  s.open("for ({} chunk = 0; chunk < {}u; chunk += {}u) {{", it, positions, per_chunk);
  s.line("unsigned hits = 0u, count = 0u;");
  s.line("{0} id[{1}], dy_base[{1}];", it, kIdsPerThread);
  s.open("NAPKIN_UNROLL for (unsigned q = 0u; q < {}u; ++q) {{", kIdsPerThread);
  s.line("const {} p = chunk + threadIdx.x * {}u + q;", it, kIdsPerThread);
  s.line("id[q] = 0u;");
  s.line("dy_base[q] = 0u;");
  s.line("if (p >= {}u) continue;", positions);
  decompose(s, id_sizes, "p", "i", it);
  s.line("dy_base[q] = {};", dot("i", dy_id_strides));
  s.line("const long long raw = (long long){};", load(ids, dot("i", id_strides)));
  s.open("if ((unsigned long long)raw >= {}ull) {{", vocab);
  s.line("if (blockIdx.x == 0u) NAPKIN_BAD_INDEX({}, raw, {}LL);", index, vocab);
  s.line("continue;");
  s.close();
  s.line("id[q] = ({})raw;", it);
  s.line("if (id[q] >= v0 && id[q] < v1) hits |= 1u << q, ++count;");
  s.close();
  // Inclusive prefix sum of the per-thread counts (Hillis-Steele).
  s.line("flags[threadIdx.x] = count;");
  s.line("__syncthreads();");
  s.open("for (unsigned step = 1u; step < {}u; step <<= 1) {{", block);
  s.line("const unsigned add = threadIdx.x >= step ? flags[threadIdx.x - step] : 0u;");
  s.line("__syncthreads();");
  s.line("flags[threadIdx.x] += add;");
  s.line("__syncthreads();");
  s.close();
  s.line("unsigned slot = flags[threadIdx.x] - count;");
  s.open("NAPKIN_UNROLL for (unsigned q = 0u; q < {}u; ++q) {{", kIdsPerThread);
  s.open("if ((hits >> q) & 1u) {{");
  s.line("list_dy[slot] = dy_base[q];");
  s.line("list_row[slot] = id[q];");
  s.line("++slot;");
  s.close();
  s.close();
  s.line("const unsigned listed = flags[{}];", block - 1);
  s.line("__syncthreads();");
  s.open("for (unsigned h = 0u; h < listed; ++h) {{");
  s.line("const {} src = list_dy[h], dst = list_row[h] * {}u;", it, out.strides[0]);
  s.open("for ({} c = threadIdx.x; c < {}u; c += {}u) {{", it, row_len, block);
  decompose(s, row_sizes, "c", "r", it);
  s.line("const {} o = dst + {};", it, dot("r", row_out));
  s.line("{}", store(out, "o", fmt::format("{} + {}", load(out, "o"), load(dy, fmt::format("src + {}", dot("r", row_dy))))));
  s.close();
  s.close();
  s.line("__syncthreads();");
  s.close();
  s.close();
  return {s.take(), {{k.name, grid, block, 0, {}}}};
}

}  // namespace napkin::codegen::cuda::detail
