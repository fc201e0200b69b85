// The routing kernels of a mixture of experts as CUDA C (ir/loop.h
// TopKParams, MoeSlotsParams; the CPU runtime's are runtime/routing.h).
//
//  top_k      one thread per row, grid-stride: k passes over the row, pass j
//             picking the element that beats every other not yet picked
//             (napkin_top_k_beats: the element after pass j - 1's pick in
//             the order, and before every other such). O(k·n) per row and
//             no memory but registers: routing's rows are short (n = the
//             experts) and k small. Values are copied as stored.
//  moe_slots  one thread does the whole choice-major scan, O(T·k): each slot
//             depends on every assignment before it in that order, and T·k
//             (a micro-batch's tokens times k) is small next to the expert
//             GEMMs around it. It checks every index first (NAPKIN_BAD_INDEX
//             and nothing written for one outside [0, E)), then fills src
//             with 0, counts each expert's assignments in `counts` itself
//             (exact: the op's rule keeps T·k within f32's integers), and
//             gives each kept assignment the next of its expert's slots.
#include <fmt/format.h>

#include "codegen/cuda/emit.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cuda::detail {

EmittedKernel emit_top_k(const Kernel& k) {
  const Operand &x = k.inputs.at(0), &values = k.output, &indices = k.extra_outputs.at(0);
  const int64_t n = x.sizes.back(), step = x.strides.back(), picks = k.top_k().k;
  const std::vector<int64_t> lead_sizes(x.sizes.begin(), x.sizes.end() - 1),
      lead_strides(x.strides.begin(), x.strides.end() - 1);
  const int64_t rows = product(lead_sizes);
  const int block = block_for(rows);
  const int64_t grid = grid_for(rows, block);
  const std::string it = index_type(std::max({rows + grid * block, max_offset(x.sizes, x.strides) + 1, values.numel()}));
  const char* ct = compute_type(x.dtype);
  Src s;
  begin_kernel(s, k.name, block);
  s.open("for ({0} r = ({0})blockIdx.x * blockDim.x + threadIdx.x; r < {1}u; r += ({0})gridDim.x * blockDim.x) {{", it,
         rows);
  if (!lead_sizes.empty()) decompose(s, lead_sizes, "r", "i", it);
  s.line("const {} xo = {};", it, dot("i", lead_strides));
  s.line("long long prev = -1;");
  s.line("{} prev_v = 0;", ct);
  s.open("for (long long j = 0; j < {}LL; ++j) {{", picks);
  s.line("long long best = -1;");
  s.line("{} best_v = 0;", ct);
  s.open("for (long long c = 0; c < {}LL; ++c) {{", n);
  s.line("const {} v = {};", ct, load(x, fmt::format("xo + ({})c * {}u", it, step)));
  s.line("if (prev >= 0 && !napkin_top_k_beats(prev_v, prev, v, c)) continue;  // picked already");
  s.open("if (best < 0 || napkin_top_k_beats(v, c, best_v, best)) {{");
  s.line("best = c;");
  s.line("best_v = v;");
  s.close();
  s.close();
  s.line("{}", store(values, fmt::format("r * {}u + ({})j", picks, it), "best_v"));
  s.line("{}", store(indices, fmt::format("r * {}u + ({})j", picks, it), "(int)best"));
  s.line("prev = best;");
  s.line("prev_v = best_v;");
  s.close();
  s.close();
  s.close();
  return {s.take(), {{k.name, grid, block, 0, {}}}, 0};
}

EmittedKernel emit_moe_slots(const Kernel& k, int index) {
  const Operand &ids = k.inputs.at(0), &pos = k.output, &src = k.extra_outputs.at(0), &counts = k.extra_outputs.at(1);
  const ir::MoeSlotsParams& p = k.moe_slots();
  const int64_t tokens = ids.sizes.at(0), picks = ids.sizes.at(1);
  const std::string id = fmt::format("t * {}LL + j * {}LL", ids.strides.at(0), ids.strides.at(1));
  Src s;
  begin_kernel(s, k.name, 1);
  s.open("for (long long t = 0; t < {}LL; ++t) {{", tokens);
  s.open("for (long long j = 0; j < {}LL; ++j) {{", picks);
  s.line("const long long e = (long long){};", load(ids, id));
  s.open("if ((unsigned long long)e >= {}ull) {{", p.experts);
  s.line("NAPKIN_BAD_INDEX({}, e, {}LL);", index, p.experts);
  s.line("return;");
  s.close();
  s.close();
  s.close();
  s.line("for (long long i = 0; i < {}LL; ++i) {}", p.experts * p.capacity, store(src, "i", "0"));
  s.line("for (long long e = 0; e < {}LL; ++e) {}", p.experts, store(counts, "e", "0.0f"));
  s.open("for (long long j = 0; j < {}LL; ++j) {{  // every token's j-th choice before any token's (j + 1)-th", picks);
  s.open("for (long long t = 0; t < {}LL; ++t) {{", tokens);
  s.line("const long long e = (long long){};", load(ids, id));
  s.line("const long long slot = (long long){};", load(counts, "e"));
  s.line("{}", store(counts, "e", "(float)(slot + 1)"));
  s.open("if (slot >= {}LL) {{", p.capacity);
  s.line("{}", store(pos, fmt::format("t * {}LL + j", picks), "-1"));  // dropped
  s.line("continue;");
  s.close();
  s.line("{}", store(pos, fmt::format("t * {}LL + j", picks), fmt::format("(int)(e * {}LL + slot)", p.capacity)));
  s.line("{}", store(src, fmt::format("e * {}LL + slot", p.capacity), "(int)t"));
  s.close();
  s.close();
  s.close();
  return {s.take(), {{k.name, 1, 1, 0, {}}}, 0};
}

}  // namespace napkin::codegen::cuda::detail
