// Elementwise kernels (one op, or a fused group computed in registers),
// constant and arange, concat/pad, embedding, and contractions the GEMM
// library cannot take. One thread per element (or per chunk of E elements
// moved with 16-byte loads, when the layout allows), grid-stride loops.
//
// Terms (besides codegen/cuda/emit.h's):
//  - element function: NAME_elem, a __device__ function computing one
//    element of the kernel from its inputs' compute values (and the
//    element's row and column for triu/causal_mask, its row-major index
//    `flat` for dropout: its ir::ElementIndex), each result rounded to
//    its IR dtype as storing and loading it would (codegen/plan.h, fused
//    loop kernel). Both the vector and the scalar loop call it.
//  - vector operand: innermost loop stride 1, read or written in chunks;
//    splat operand: innermost stride 0 (a broadcast along it), read once per
//    chunk.
#include <algorithm>

#include "codegen/cuda/emit.h"
#include "ir/elementwise_formulas.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cuda::detail {

namespace {

using ir::DType;
using ir::Op;

// CUDA C expressions for ir/elementwise_formulas.h: a value is an expression
// of its dtype's compute type; the math primitives are the prelude's.
class CudaArithmetic {
 public:
  struct Handle {
    std::string text;
    DType dtype = DType::F32;
  };

  // Each math function's result becomes a named temporary in `body` (names
  // `prefix`0, 1, ...), so a value a formula uses twice (tanh in gelu_grad,
  // exp(-|x|) in softplus) is computed once by the source itself, not by
  // NVRTC's common-subexpression elimination. Operators stay inline, and so
  // does dropout's keep test, which only runs where its `?:` selects it.
  CudaArithmetic(Src& body, std::string prefix) : body_(body), prefix_(std::move(prefix)) {}

  Handle constant(const Handle& like, double v) const { return {literal(like.dtype, v), like.dtype}; }
  Handle add(const Handle& x, const Handle& y) const { return infix(x, "+", y, x.dtype); }
  Handle sub(const Handle& x, const Handle& y) const { return infix(x, "-", y, x.dtype); }
  Handle mul(const Handle& x, const Handle& y) const { return infix(x, "*", y, x.dtype); }
  Handle div(const Handle& x, const Handle& y) const { return infix(x, "/", y, x.dtype); }
  Handle neg(const Handle& x) const { return {fmt::format("(-{})", x.text), x.dtype}; }
  Handle less(const Handle& x, const Handle& y) const { return infix(x, "<", y, DType::Bool); }
  Handle less_equal(const Handle& x, const Handle& y) const { return infix(x, "<=", y, DType::Bool); }
  Handle greater(const Handle& x, const Handle& y) const { return infix(x, ">", y, DType::Bool); }
  Handle greater_equal(const Handle& x, const Handle& y) const { return infix(x, ">=", y, DType::Bool); }
  Handle equal(const Handle& x, const Handle& y) const { return infix(x, "==", y, DType::Bool); }
  Handle not_equal(const Handle& x, const Handle& y) const { return infix(x, "!=", y, DType::Bool); }
  Handle select(const Handle& cond, const Handle& x, const Handle& y) const {
    return {fmt::format("({} ? {} : {})", cond.text, x.text, y.text), x.dtype};
  }
  Handle exp(const Handle& x) const { return call("napkin_exp", x); }
  Handle log(const Handle& x) const { return call("napkin_log", x); }
  Handle tanh(const Handle& x) const { return call("napkin_tanh", x); }
  Handle erf(const Handle& x) const { return call("napkin_erf", x); }
  Handle sqrt(const Handle& x) const { return call("napkin_sqrt", x); }
  Handle sin(const Handle& x) const { return call("napkin_sin", x); }
  Handle cos(const Handle& x) const { return call("napkin_cos", x); }
  Handle abs(const Handle& x) const {
    if (ir::is_floating(x.dtype)) return call("napkin_fabs", x);
    return {fmt::format("({0} < 0 ? -{0} : {0})", x.text), x.dtype};
  }
  Handle pow(const Handle& x, const Handle& y) const {
    NAPKIN_INTERNAL_CHECK(ir::is_floating(x.dtype), "pow of integers has no lowering");
    return call("napkin_pow", x, y);
  }
  Handle maximum(const Handle& x, const Handle& y) const { return call("napkin_maximum", x, y); }
  Handle minimum(const Handle& x, const Handle& y) const { return call("napkin_minimum", x, y); }
  Handle convert(const Handle& x, DType from, DType to) const { return {detail::convert(x.text, from, to), to}; }
  // `flat` is unsigned long long, the rng words long long.
  Handle dropout_keep(const Handle& flat, uint32_t stream, const Handle& seed_lo, const Handle& seed_hi, const Handle& step,
                      uint32_t threshold) const {
    return {fmt::format("(napkin_philox_word0((unsigned){}, {}u, (unsigned){}, (unsigned)((unsigned long long){} >> 32), "
                        "(unsigned){}, (unsigned){}) >= {}u)",
                        flat.text, stream, step.text, step.text, seed_lo.text, seed_hi.text, threshold),
            DType::Bool};
  }

 private:
  static Handle infix(const Handle& x, const char* op, const Handle& y, DType result) {
    return {fmt::format("({} {} {})", x.text, op, y.text), result};
  }
  Handle call(const char* f, const Handle& x) const { return temporary(fmt::format("{}({})", f, x.text), x.dtype); }
  Handle call(const char* f, const Handle& x, const Handle& y) const {
    return temporary(fmt::format("{}({}, {})", f, x.text, y.text), x.dtype);
  }
  Handle temporary(const std::string& expr, DType dtype) const {
    std::string name = fmt::format("{}{}", prefix_, temporaries_++);
    body_.line("const {} {} = {};", compute_type(dtype), name, expr);
    return {name, dtype};
  }

  Src& body_;
  std::string prefix_;
  mutable int temporaries_ = 0;
};

// One element of elementwise op `op` in compute types: args are variable
// names of the inputs' compute values (`dtypes` their dtypes), `to` the
// result dtype; row, col and flat name the element's position. The
// statements of its temporaries (named `temporaries`0, 1, ...) go to `body`;
// the returned expression reads them.
std::string op_expr(Src& body, const std::string& temporaries, Op op, const ir::Attrs& attrs,
                    const std::vector<std::string>& args, const std::vector<DType>& dtypes, DType to) {
  CudaArithmetic arith(body, temporaries);
  using Value = ir::formulas::Value<CudaArithmetic>;
  std::vector<Value> values;
  for (size_t i = 0; i < args.size(); ++i) values.emplace_back(arith, CudaArithmetic::Handle{args[i], dtypes[i]});
  auto index = [&](const std::string& name) { return Value(arith, {name, DType::I64}); };
  ir::formulas::Position<CudaArithmetic> at{index("row"), index("col"), index("flat")};
  DType from = dtypes.empty() ? to : dtypes[0];
  return ir::formulas::apply_elementwise(op, attrs, from, to, values, at).handle().text;
}

// An elementwise loop: the iteration shape, each input's and output's
// strides over it, and how one element is computed.
struct ElementwiseLoop {
  std::vector<int64_t> sizes;
  std::vector<const Operand*> inputs, outputs;
  std::vector<std::vector<int64_t>> in_strides, out_strides;
  bool row_col = false;  // the element function takes the element's (row, col)
  bool flat = false;     // ... and its row-major index
};

// Collapses the loop's dims; with row_col the last two dims stay apart (the
// element function needs them) and only the ones before them merge.
void collapse(ElementwiseLoop& l) {
  std::vector<std::vector<int64_t>*> all;
  for (auto& s : l.out_strides) all.push_back(&s);
  for (auto& s : l.in_strides) all.push_back(&s);
  if (!l.row_col) {
    collapse_dims(l.sizes, all);
    return;
  }
  size_t r = l.sizes.size();
  NAPKIN_INTERNAL_CHECK(r >= 2, "triu/causal_mask below rank 2");
  std::vector<int64_t> lead(l.sizes.begin(), l.sizes.end() - 2);
  std::vector<std::vector<int64_t>> lead_strides;
  for (auto* s : all) lead_strides.emplace_back(s->begin(), s->end() - 2);
  std::vector<std::vector<int64_t>*> lead_ptrs;
  for (auto& s : lead_strides) lead_ptrs.push_back(&s);
  collapse_dims(lead, lead_ptrs);
  std::vector<int64_t> sizes = lead;
  sizes.insert(sizes.end(), l.sizes.end() - 2, l.sizes.end());
  for (size_t o = 0; o < all.size(); ++o) {
    std::vector<int64_t> s = lead_strides[o];
    s.insert(s.end(), all[o]->end() - 2, all[o]->end());
    *all[o] = std::move(s);
  }
  l.sizes = std::move(sizes);
}

// Elements per chunk for the vector loop, or 0 when the layout does not allow
// it: every operand's innermost stride 1 (or 0 for inputs), the innermost size
// a multiple of the chunk, and every chunk 16-byte aligned.
int vector_width(const ElementwiseLoop& l) {
  int min_size = 16;
  auto outer = [](const std::vector<int64_t>& s) { return std::vector<int64_t>(s.begin(), s.end() - 1); };
  for (size_t i = 0; i < l.outputs.size(); ++i) {
    if (l.out_strides[i].back() != 1) return 0;
    min_size = std::min(min_size, ir::dtype_size(l.outputs[i]->dtype));
  }
  for (size_t i = 0; i < l.inputs.size(); ++i) {
    int64_t inner = l.in_strides[i].back();
    if (inner != 0 && inner != 1) return 0;
    if (inner == 1) min_size = std::min(min_size, ir::dtype_size(l.inputs[i]->dtype));
  }
  int E = 16 / min_size;
  if (l.sizes.back() % E != 0) return 0;
  for (size_t i = 0; i < l.outputs.size(); ++i)
    if (!aligned16(*l.outputs[i], outer(l.out_strides[i]))) return 0;
  for (size_t i = 0; i < l.inputs.size(); ++i)
    if (l.in_strides[i].back() == 1 && !aligned16(*l.inputs[i], outer(l.in_strides[i]))) return 0;
  return E;
}

bool all_zero(const std::vector<int64_t>& s) {
  return std::all_of(s.begin(), s.end(), [](int64_t v) { return v == 0; });
}

// The kernel over loop l whose element function (already in `elem_fn`, named
// fn) takes the inputs' compute values, then (row, col) if l.row_col, the
// flat index if l.flat, then the outputs by reference.
EmittedKernel elementwise_kernel(const Kernel& k, ElementwiseLoop& l, const std::string& elem_fn, const std::string& fn) {
  Src s;
  int64_t n = product(l.sizes);
  int E = vector_width(l);
  int64_t items = E ? n / E : n;
  int block = block_for(items);
  int64_t grid = grid_for(items, block);
  int64_t bound = n + grid * block;
  for (size_t i = 0; i < l.inputs.size(); ++i) bound = std::max(bound, max_offset(l.sizes, l.in_strides[i]));
  std::string it = index_type(bound);

  begin_kernel(s, k.name, block);
  // Inputs broadcast to every element: one load before the loop.
  std::vector<bool> hoisted(l.inputs.size(), false);
  for (size_t i = 0; i < l.inputs.size(); ++i) {
    if (!all_zero(l.in_strides[i])) continue;
    hoisted[i] = true;
    s.line("const {} in{} = {};", compute_type(l.inputs[i]->dtype), i, load(*l.inputs[i], "0"));
  }
  s.open("for ({0} t = ({0})blockIdx.x * blockDim.x + threadIdx.x; t < {1}u; t += ({0})gridDim.x * blockDim.x) {{", it, items);
  if (E) s.line("const {} i = t * {}u;", it, E);
  else s.line("const {} i = t;", it);
  decompose(s, l.sizes, "i", "i", it);
  int lanes = E ? E : 1;
  auto in_name = [&](size_t i, int e) {
    if (hoisted[i]) return fmt::format("in{}", i);
    bool splat = E && l.in_strides[i].back() == 0;
    return E && !splat ? fmt::format("in{}[{}]", i, e) : fmt::format("in{}", i);
  };
  for (size_t i = 0; i < l.inputs.size(); ++i) {
    if (hoisted[i]) continue;
    const Operand& in = *l.inputs[i];
    std::string at = dot("i", l.in_strides[i]);
    if (E && l.in_strides[i].back() == 1) {
      s.line("{} in{}[{}];", compute_type(in.dtype), i, E);
      vector_load(s, in, at, E, [&](int e) { return fmt::format("in{}[{}]", i, e); });
    } else {
      s.line("const {} in{} = {};", compute_type(in.dtype), i, load(in, at));
    }
  }
  for (size_t o = 0; o < l.outputs.size(); ++o) s.line("{} out{}[{}];", compute_type(l.outputs[o]->dtype), o, lanes);
  for (int e = 0; e < lanes; ++e) {
    std::vector<std::string> args;
    for (size_t i = 0; i < l.inputs.size(); ++i) args.push_back(in_name(i, e));
    if (l.row_col) {
      size_t r = l.sizes.size();
      args.push_back(fmt::format("(long long)i{}", r - 2));
      args.push_back(e ? fmt::format("(long long)(i{} + {}u)", r - 1, e) : fmt::format("(long long)i{}", r - 1));
    }
    // i is the row-major index of the (chunk's first) element: collapsing dims keeps it.
    if (l.flat) args.push_back(e ? fmt::format("(unsigned long long)(i + {}u)", e) : "(unsigned long long)i");
    for (size_t o = 0; o < l.outputs.size(); ++o) args.push_back(fmt::format("out{}[{}]", o, e));
    s.line("{}({});", fn, fmt::join(args, ", "));
  }
  for (size_t o = 0; o < l.outputs.size(); ++o) {
    std::string at = dot("i", l.out_strides[o]);
    if (E) vector_store(s, *l.outputs[o], at, E, [&](int e) { return fmt::format("out{}[{}]", o, e); });
    else s.line("{}", store(*l.outputs[o], at, fmt::format("out{}[0]", o)));
  }
  s.close();
  s.close();
  EmittedKernel out;
  out.text = elem_fn + s.take();
  out.launches.push_back({k.name, grid, block, 0, {}});
  return out;
}

// The element function's parameter list.
std::string elem_params(const ElementwiseLoop& l) {
  std::vector<std::string> p;
  for (size_t i = 0; i < l.inputs.size(); ++i) p.push_back(fmt::format("const {} a{}", compute_type(l.inputs[i]->dtype), i));
  if (l.row_col) p.push_back("const long long row"), p.push_back("const long long col");
  if (l.flat) p.push_back("const unsigned long long flat");
  for (size_t o = 0; o < l.outputs.size(); ++o) p.push_back(fmt::format("{}& r{}", compute_type(l.outputs[o]->dtype), o));
  return fmt::format("{}", fmt::join(p, ", "));
}

}  // namespace

// The lines `const T vJ = ...;` computing the fused kernel's ops [0, count)
// from the inputs' compute values a0, a1, ..., each rounded to its dtype.
void fused_ops(Src& f, const Kernel& k, size_t count) {
  const FusedLoop& fl = *k.fused;
  for (size_t j = 0; j < count; ++j) {
    const FusedOp& op = fl.ops[j];
    std::string value;
    if (op.op == Op::Constant) {
      value = literal(op.dtype, op.attrs.get_double("value"));
    } else {
      std::vector<std::string> args;
      std::vector<DType> dtypes;
      for (const FusedArg& a : op.args) {
        args.push_back(fmt::format("{}{}", a.input ? "a" : "v", a.index));
        dtypes.push_back(a.input ? k.inputs[a.index].dtype : fl.ops[a.index].dtype);
      }
      value = op_expr(f, fmt::format("t{}_", j), op.op, op.attrs, args, dtypes, op.dtype);
    }
    f.line("const {} v{} = {};", compute_type(op.dtype), j, as_stored(op.dtype, value));
  }
}

EmittedKernel emit_elementwise(const Kernel& k) {
  ElementwiseLoop l;
  Src f;
  std::string fn = k.name + "_elem";
  auto needs = [](Op op, ir::ElementIndex what) { return ir::op_info(op).element_index == what; };
  if (k.fused) {
    const FusedLoop& fl = *k.fused;
    l.sizes = fl.shape;
    for (const Operand& in : k.inputs) l.inputs.push_back(&in), l.in_strides.push_back(broadcast_strides(in, fl.shape));
    for (const Operand& out : fl.outputs) l.outputs.push_back(&out), l.out_strides.push_back(out.strides);
    l.row_col = std::any_of(fl.ops.begin(), fl.ops.end(), [&](const FusedOp& op) { return needs(op.op, ir::ElementIndex::RowCol); });
    l.flat = std::any_of(fl.ops.begin(), fl.ops.end(), [&](const FusedOp& op) { return needs(op.op, ir::ElementIndex::Flat); });
    f.open("NAPKIN_DEVICE void {}({}) {{", fn, elem_params(l));
    fused_ops(f, k, fl.ops.size());
    for (size_t o = 0; o < fl.outputs.size(); ++o) f.line("r{} = v{};", o, fl.output_ops[o]);
    f.close();
  } else {
    l.sizes = k.output.sizes;
    for (const Operand& in : k.inputs) l.inputs.push_back(&in), l.in_strides.push_back(broadcast_strides(in, l.sizes));
    l.outputs.push_back(&k.output);
    l.out_strides.push_back(k.output.strides);
    l.row_col = needs(k.op, ir::ElementIndex::RowCol);
    l.flat = needs(k.op, ir::ElementIndex::Flat);
    std::vector<std::string> args;
    std::vector<DType> dtypes;
    for (size_t i = 0; i < k.inputs.size(); ++i) args.push_back(fmt::format("a{}", i)), dtypes.push_back(k.inputs[i].dtype);
    f.open("NAPKIN_DEVICE void {}({}) {{", fn, elem_params(l));
    std::string value = op_expr(f, "t", k.op, k.attrs, args, dtypes, k.output.dtype);
    f.line("r0 = {};", value);
    f.close();
  }
  if (l.sizes.empty()) {  // a scalar: one element
    l.sizes.push_back(1);
    for (auto& s : l.in_strides) s.push_back(0);
    for (auto& s : l.out_strides) s.push_back(0);
  }
  collapse(l);
  return elementwise_kernel(k, l, f.take(), fn);
}

std::string fused_prologue(const Kernel& k, const std::string& fn) {
  const FusedLoop& fl = *k.fused;
  const FusedOp& reduce = fl.ops.back();
  NAPKIN_INTERNAL_CHECK(!reduce.args.empty(), "fused reduction {} reduces nothing", k.name);
  const FusedArg reduced = reduce.args[0];  // a member's result, or a kernel input the members read too
  const ir::DType reduced_dtype = reduced.input ? k.inputs[reduced.index].dtype : fl.ops[reduced.index].dtype;
  std::vector<std::string> params;
  for (size_t i = 0; i < k.inputs.size(); ++i) params.push_back(fmt::format("const {} a{}", compute_type(k.inputs[i].dtype), i));
  for (size_t o = 1; o < fl.outputs.size(); ++o) params.push_back(fmt::format("{}& s{}", compute_type(fl.outputs[o].dtype), o - 1));
  Src f;
  f.open("NAPKIN_DEVICE {} {}({}) {{", compute_type(reduced_dtype), fn, fmt::join(params, ", "));
  fused_ops(f, k, fl.ops.size() - 1);
  for (size_t o = 1; o < fl.outputs.size(); ++o) f.line("s{} = v{};", o - 1, fl.output_ops[o]);
  f.line("return {}{};", reduced.input ? "a" : "v", reduced.index);
  f.close();
  return f.take();
}

EmittedKernel emit_fill(const Kernel& k) {
  Src s;
  EmittedKernel out;
  const ir::FillParams& p = k.fill();
  if (p.pattern == ir::FillPattern::Constant) {
    begin_kernel(s, k.name, 32);
    s.line("if (blockIdx.x == 0 && threadIdx.x == 0) {}", store(k.output, "0", literal(k.output.dtype, p.value)));
    s.close();
    out.launches.push_back({k.name, 1, 32, 0, {}});
  } else {  // arange
    int64_t n = k.output.numel();
    int block = block_for(n);
    int64_t grid = grid_for(n, block);
    std::string it = index_type(n + grid * block);
    begin_kernel(s, k.name, block);
    s.open("for ({0} i = ({0})blockIdx.x * blockDim.x + threadIdx.x; i < {1}u; i += ({0})gridDim.x * blockDim.x) {{", it, n);
    s.line("{}", store(k.output, "i", convert("(long long)i", DType::I64, k.output.dtype)));
    s.close();
    s.close();
    out.launches.push_back({k.name, grid, block, 0, {}});
  }
  out.text = s.take();
  return out;
}

// A collective on one device (all_reduce_sum, all_gather, reduce_scatter):
// over one rank each is its operand, copied to the output (one thread per
// element; the memory plan may give the input and the output the same
// bytes, and each thread reads its element first).
EmittedKernel emit_collective(const Kernel& k) {
  const Operand& x = k.inputs.at(0);
  NAPKIN_INTERNAL_CHECK(x.contiguous() && k.output.contiguous() && x.numel() == k.output.numel(),
                        "collective kernel {}: input and output are not the same contiguous count", k.name);
  const int64_t n = x.numel();
  const int block = block_for(n);
  const int64_t grid = grid_for(n, block);
  const std::string it = index_type(n + grid * block);
  Src s;
  begin_kernel(s, k.name, block);
  s.open("for ({0} i = ({0})blockIdx.x * blockDim.x + threadIdx.x; i < {1}u; i += ({0})gridDim.x * blockDim.x) {{", it, n);
  s.line("{}", store(k.output, "i", load(x, "i")));
  s.close();
  s.close();
  return {s.take(), {{k.name, grid, block, 0, {}}}, 0};
}

// One thread per output element: which input (or the padding) it comes from
// is decided by its index along the axis.
EmittedKernel emit_concat_or_pad(const Kernel& k) {
  const Operand& out = k.output;
  const ir::ConcatParams& p = k.concat();
  int axis = normalize_axis(p.axis, out.sizes.size());
  int64_t n = out.numel();
  int block = block_for(n);
  int64_t grid = grid_for(n, block);
  int64_t bound = n + grid * block;
  for (const Operand& in : k.inputs) bound = std::max(bound, max_offset(in.sizes, in.strides));
  std::string it = index_type(bound);
  Src s;
  begin_kernel(s, k.name, block);
  s.open("for ({0} t = ({0})blockIdx.x * blockDim.x + threadIdx.x; t < {1}u; t += ({0})gridDim.x * blockDim.x) {{", it, n);
  decompose(s, out.sizes, "t", "i", it);
  std::string at = fmt::format("i{}", axis);
  std::string dst = dot("i", out.strides);
  // The input's index along the axis replaces i<axis>: j<axis> = i<axis> - shift.
  auto read = [&](const Operand& in, int64_t shift) {
    for (size_t d = 0; d < out.sizes.size(); ++d)
      s.line("const {} j{} = i{}{};", it, d, d, static_cast<int>(d) == axis && shift ? fmt::format(" - {}u", shift) : "");
    s.line("{}", store(out, dst, load(in, dot("j", in.strides))));
  };
  if (p.pad_before) {
    int64_t before = *p.pad_before;
    int64_t len = k.inputs[0].sizes[axis];
    s.open("if ({0} >= {1}u && {0} < {2}u) {{", at, before, before + len);
    read(k.inputs[0], before);
    s.close("} else {");
    s.line("  {}", store(out, dst, literal(out.dtype, 0.0)));
    s.line("}}");
  } else {
    int64_t shift = 0;
    for (size_t j = 0; j < k.inputs.size(); ++j) {
      const Operand& in = k.inputs[j];
      s.open("{}if ({} < {}u) {{", j ? "else " : "", at, shift + in.sizes[axis]);
      read(in, shift);
      s.close();
      shift += in.sizes[axis];
    }
  }
  s.close();
  s.close();
  return {s.take(), {{k.name, grid, block, 0, {}}}};
}

// out[ids..., row...] = table[id, row...]: one thread per output element, or
// per chunk of a row when rows are contiguous and aligned.
EmittedKernel emit_embedding(const Kernel& k, int index) {
  const Operand& table = k.inputs[0];
  const Operand& ids = k.inputs[1];
  const Operand& out = k.output;
  const auto [vocab, id_sizes, id_strides, out_id_strides, row_sizes, row_table, row_out] = embedding_loop(k);
  int64_t positions = product(id_sizes), row_len = product(row_sizes);
  int E = 16 / std::min(ir::dtype_size(table.dtype), ir::dtype_size(out.dtype));
  bool vec = row_sizes.size() == 1 && row_table[0] == 1 && row_out[0] == 1 && row_len % E == 0 &&
             aligned16(table, {table.strides[0]}) && aligned16(out, out_id_strides);
  if (!vec) E = 1;
  int64_t per_row = row_len / E;
  int64_t items = positions * per_row;
  int block = block_for(items);
  int64_t grid = grid_for(items, block);
  int64_t bound = std::max({items + grid * block, out.numel(), max_offset(id_sizes, id_strides)});
  std::string it = index_type(bound);
  bool long_table = table.numel() >= (int64_t{1} << 31);
  Src s;
  begin_kernel(s, k.name, block);
  s.open("for ({0} t = ({0})blockIdx.x * blockDim.x + threadIdx.x; t < {1}u; t += ({0})gridDim.x * blockDim.x) {{", it, items);
  s.line("const {} p = t / {}u;", it, per_row);
  s.line("const {} c = t % {}u;", it, per_row);
  decompose(s, id_sizes, "p", "i", it);
  s.line("const long long id = (long long){};", load(ids, dot("i", id_strides)));
  s.open("if ((unsigned long long)id >= {}ull) {{", vocab);
  s.line("if (c == 0u) NAPKIN_BAD_INDEX({}, id, {}LL);", index, vocab);
  s.line("continue;");
  s.close();
  std::string table_row = fmt::format("({})id * {}u", long_table ? "unsigned long long" : it, table.strides[0]);
  std::string out_row = dot("i", out_id_strides);
  if (vec) {
    s.line("{} v[{}];", compute_type(table.dtype), E);
    vector_load(s, table, fmt::format("{} + c * {}u", table_row, E), E, [](int e) { return fmt::format("v[{}]", e); });
    vector_store(s, out, fmt::format("{} + c * {}u", out_row, E), E, [](int e) { return fmt::format("v[{}]", e); });
  } else {
    decompose(s, row_sizes, "c", "r", it);
    s.line("{}", store(out, fmt::format("{} + {}", out_row, dot("r", row_out)),
                       load(table, fmt::format("{} + {}", table_row, dot("r", row_table)))));
  }
  s.close();
  s.close();
  return {s.take(), {{k.name, grid, block, 0, {}}}};
}

// A contraction the GEMM library cannot take (integer, fp8): one thread per
// output element sums its products in a register of the output's compute
// type (f32 for narrow floats) and stores once. Correct, not fast.
EmittedKernel emit_contraction(const Kernel& k) {
  const Operand& a = k.inputs[0];
  const Operand& b = k.inputs[1];
  const Operand& out = k.output;
  std::vector<int64_t> out_sizes, oa, ob, oc, sum_sizes, ra, rb;
  for (const ContractionAxis& ax : k.contraction) {
    if (ax.c != 0 || ax.size == 1) out_sizes.push_back(ax.size), oa.push_back(ax.a), ob.push_back(ax.b), oc.push_back(ax.c);
    else sum_sizes.push_back(ax.size), ra.push_back(ax.a), rb.push_back(ax.b);
  }
  if (out_sizes.empty()) out_sizes.push_back(1), oa.push_back(0), ob.push_back(0), oc.push_back(0);
  int64_t n = product(out_sizes);
  int block = block_for(n);
  int64_t grid = grid_for(n, block);
  int64_t bound = std::max({n + grid * block, a.numel(), b.numel(), out.numel(), max_offset(out_sizes, oa) + max_offset(sum_sizes, ra),
                            max_offset(out_sizes, ob) + max_offset(sum_sizes, rb)});
  std::string it = index_type(bound);
  const char* ct = compute_type(out.dtype);
  Src s;
  begin_kernel(s, k.name, block);
  s.open("for ({0} t = ({0})blockIdx.x * blockDim.x + threadIdx.x; t < {1}u; t += ({0})gridDim.x * blockDim.x) {{", it, n);
  decompose(s, out_sizes, "t", "i", it);
  s.line("const {} base_a = {};", it, dot("i", oa));
  s.line("const {} base_b = {};", it, dot("i", ob));
  s.line("{} acc = {};", ct, literal(out.dtype, 0.0));
  for (size_t d = 0; d < sum_sizes.size(); ++d) s.open("for ({0} s{1} = 0; s{1} < {2}u; ++s{1}) {{", it, d, sum_sizes[d]);
  s.line("const {} x = {};", ct, convert(load(a, "base_a + " + dot("s", ra)), a.dtype, out.dtype));
  s.line("const {} y = {};", ct, convert(load(b, "base_b + " + dot("s", rb)), b.dtype, out.dtype));
  s.line("acc = acc + x * y;");
  for (size_t d = 0; d < sum_sizes.size(); ++d) s.close();
  s.line("{}", store(out, dot("i", oc), "acc"));
  s.close();
  s.close();
  return {s.take(), {{k.name, grid, block, 0, {}}}};
}

}  // namespace napkin::codegen::cuda::detail
