// A batch's kernel (codegen/plan.h Kernel::batch; ir/fusion_group.h): the
// same fused ops over a table of tensors, in one launch: every parameter's
// AdamW update, or every parameter's sum of squares for gradient clipping.
//
// Terms:
//  - member: one group of the batch, a flat loop over its numel elements;
//    its operands' byte offsets come in the offsets parameter (a `switch`
//    on the member picks them), so the text carries no arena layout.
//  - chunk: kChunk consecutive elements of one member, one block's work
//    item. NAME_first[m] is member m's first chunk (the last entry: the
//    total), NAME_numel[m] its element count; a block finds its member by
//    binary search.
//  - a batch of reductions (each member reduces all its elements to one
//    value, and may store prologue results too): each chunk's block leaves
//    its partial in `scratch` (a fixed tree over the block), and a second
//    launch, a warp per member, combines its partials in chunk order.
//  - run mask: an optimizer batch of updates (one member per parameter)
//    skips the members whose NAME_run[m] is 0. Every member runs unless the
//    engine writes the global: ZeRO's ranks run their own parameters'
//    updates only (runtime/optimizer_shards.h), whose state alone they map.
#include <fmt/format.h>

#include "codegen/cuda/emit.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cuda::detail {

namespace {

using ir::DType;

constexpr int64_t kChunk = 4096;
constexpr int kBlock = 256;

// The lines that set b0, b1, ... (byte offsets of the member's inputs, then
// outputs) for member `m`.
void member_bases(Src& s, const Kernel& k, const std::string& m) {
  const size_t n_ops = k.inputs.size() + k.fused->outputs.size();
  s.line("long long {};", [&] {
    std::string names;
    for (size_t j = 0; j < n_ops; ++j) names += fmt::format("{}b{} = 0", j ? ", " : "", j);
    return names;
  }());
  s.open("switch ({}) {{", m);
  for (size_t i = 0; i < k.batch.size(); ++i) {
    const BatchMember& member = k.batch[i];
    std::string line = fmt::format("case {}:", i);
    size_t j = 0;
    for (const Operand& o : member.inputs) line += fmt::format(" b{} = {};", j++, offset_marker(o, false));
    for (const Operand& o : member.outputs) line += fmt::format(" b{} = {};", j++, offset_marker(o, false));
    s.line("{} break;", line);
  }
  s.close();
}

// Element `index` of operand j (dtype t) at byte offset b<j>.
std::string element(DType t, size_t j, const std::string& index) {
  return fmt::format("(({}*)(arena + b{}))[{}]", storage_type(t), j, index);
}

}  // namespace

bool runs_members_apart(const Kernel& k) {
  return !k.batch.empty() && k.phase == ir::Phase::Optimizer && k.kind != KernelKind::Reduction;
}

EmittedKernel emit_batch(const Kernel& k) {
  NAPKIN_INTERNAL_CHECK(k.fused && !k.batch.empty(), "{} is no batch", k.name);
  const FusedLoop& f = *k.fused;
  const bool reduces = k.kind == KernelKind::Reduction;
  const size_t n_in = k.inputs.size(), n_out = f.outputs.size();
  const int64_t members = static_cast<int64_t>(k.batch.size());
  std::vector<int64_t> first;
  int64_t chunks = 0;
  for (const BatchMember& m : k.batch) {
    first.push_back(chunks);
    chunks += (std::max<int64_t>(m.numel, 1) + kChunk - 1) / kChunk;
  }
  first.push_back(chunks);
  Src s;
  s.line("__device__ const long long {}_first[{}] = {{{}}};", k.name, first.size(), fmt::join(first, ", "));
  std::vector<int64_t> numels;
  for (const BatchMember& m : k.batch) numels.push_back(m.numel);
  s.line("__device__ const long long {}_numel[{}] = {{{}}};", k.name, numels.size(), fmt::join(numels, ", "));

  const bool masked = runs_members_apart(k);
  if (masked) s.line("__device__ unsigned char {}_run[{}] = {{{}}};", k.name, members, fmt::join(std::vector<int>(k.batch.size(), 1), ", "));
  const char* ct = reduces ? compute_type(k.output.dtype) : "";
  const Combine c = reduces ? combine_of(k.reduction().combiner, k.output.dtype) : Combine{};
  const size_t prologue = reduces ? f.ops.size() - 1 : f.ops.size();
  begin_kernel(s, k.name, kBlock);
  if (reduces) s.line("__shared__ {} red[32];", ct);
  s.open("for (long long c = blockIdx.x; c < {}LL; c += gridDim.x) {{", chunks);
  s.line("int lo = 0, hi = {};", members);
  s.line("while (hi - lo > 1) {{ const int mid = (lo + hi) / 2; if ({}_first[mid] <= c) lo = mid; else hi = mid; }}", k.name);
  if (masked) s.line("if (!{}_run[lo]) continue;  // another rank's parameter", k.name);
  member_bases(s, k, "lo");
  s.line("const long long start = (c - {0}_first[lo]) * {1}LL;", k.name, kChunk);
  s.line("const long long end = start + {1}LL < {0}_numel[lo] ? start + {1}LL : {0}_numel[lo];", k.name, kChunk);
  if (reduces) s.line("{} acc = {};", ct, c.identity);
  // Scalar inputs (learning rate, clipping scale, bias corrections) once per
  // chunk, before the loop: in it, every element would reload them, since a
  // store through the arena might alias them as far as the compiler knows.
  for (size_t j = 0; j < n_in; ++j)
    if (k.inputs[j].sizes.empty())
      s.line("const {} a{} = {};", compute_type(k.inputs[j].dtype), j,
             from_storage(k.inputs[j].dtype, element(k.inputs[j].dtype, j, "0")));
  s.open("for (long long i = start + threadIdx.x; i < end; i += {}) {{", kBlock);
  for (size_t j = 0; j < n_in; ++j)
    if (!k.inputs[j].sizes.empty())
      s.line("const {} a{} = {};", compute_type(k.inputs[j].dtype), j,
             from_storage(k.inputs[j].dtype, element(k.inputs[j].dtype, j, "i")));
  fused_ops(s, k, prologue);
  for (size_t o = reduces ? 1 : 0; o < n_out; ++o) {
    const Operand& out = f.outputs[o];
    s.line("{} = {};", element(out.dtype, n_in + o, out.sizes.empty() ? "0" : "i"),
           to_storage(out.dtype, fmt::format("v{}", f.output_ops[o])));
  }
  if (reduces) {
    const FusedOp& reduce = f.ops.back();
    NAPKIN_INTERNAL_CHECK(!reduce.args.empty() && !reduce.args[0].input, "batch {} reduces no member", k.name);
    const int r = reduce.args[0].index;
    s.line("acc = {}(acc, {});", c.op, convert(fmt::format("v{}", r), f.ops[r].dtype, k.output.dtype));
  }
  s.close();
  if (reduces) {
    s.line("acc = napkin_block_reduce(acc, {}, {}, red);", c.op, c.identity);
    s.line("if (threadIdx.x == 0u) (({}*)scratch)[c] = acc;", ct);
    s.line("__syncthreads();  // red is reused by the next chunk");
  }
  s.close();
  s.close();

  EmittedKernel e;
  e.launches.push_back({k.name, std::min<int64_t>(chunks, kMaxGrid), kBlock, 0, {}});
  if (reduces) {
    // A warp per member: its partials in chunk order (lanes, then the butterfly).
    const std::string name2 = k.name + "_2";
    const int warps = 8;
    begin_kernel(s, name2, warps * 32);
    s.open("for (int m = blockIdx.x * {0} + (threadIdx.x >> 5); m < {1}; m += gridDim.x * {0}) {{", warps, members);
    s.line("{} acc = {};", ct, c.identity);
    s.line("for (long long p = {0}_first[m] + (threadIdx.x & 31u); p < {0}_first[m + 1]; p += 32) acc = {1}(acc, (({2}*)scratch)[p]);",
           k.name, c.op, ct);
    s.line("acc = napkin_warp_reduce(acc, {});", c.op);
    if (k.reduction().mean) s.line("acc = acc / ({})({}_numel[m]);", ct, k.name);
    member_bases(s, k, "m");
    s.line("if ((threadIdx.x & 31u) == 0u) {} = {};", element(k.output.dtype, n_in, "0"), to_storage(k.output.dtype, "acc"));
    s.close();
    s.close();
    e.launches.push_back({name2, grid_for(members, warps), warps * 32, 0, {}});
    e.scratch_bytes = chunks * compute_size(k.output.dtype);
  }
  e.text = s.take();
  return e;
}

}  // namespace napkin::codegen::cuda::detail
