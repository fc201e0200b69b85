#include "codegen/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "analysis/memory.h"
#include "ir/fusion_group.h"
#include "ir/gemm_epilogue.h"
#include "ir/internal_check.h"

namespace napkin::codegen {

int64_t Operand::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

bool Operand::contiguous() const { return ir::is_contiguous(ir::Layout{strides, 0}, sizes); }

namespace {

Operand operand(const ir::Graph& g, const analysis::MemoryPlan& arena, ir::ValueId v) {
  const ir::Value& value = g.value(v);
  Operand o;
  o.value = v;
  o.dtype = value.type.dtype;
  o.byte_offset = arena.offset_of(g, v);
  o.sizes = value.type.sizes();
  o.strides = value.layout.strides;
  return o;
}

std::string where(const ir::Node& n) {
  if (!n.loc.known()) return n.scope;
  std::string s = fmt::format("{}:{}:{}", *n.loc.file, n.loc.line, n.loc.col);
  if (!n.scope.empty()) s += fmt::format(" ({})", n.scope);
  return s;
}

// A GEMM epilogue group's kernel (ir/gemm_epilogue.h) as a Gemm: the
// contraction's inputs are A and B, its sums go straight into the epilogue,
// and D (the group's one output) is C of the lowering, a plain row-major
// [rows, n] product by the form's conditions.
void gemm_with_epilogue(const ir::Graph& g, const ir::FusionGroup& fg, Kernel& k) {
  const ir::Node& c = g.node(fg.contraction);
  const std::vector<ir::NodeId> steps(fg.nodes.begin() + 1, fg.nodes.end());
  const std::optional<ir::GemmEpilogue> form = ir::match_gemm_epilogue(g, c.id, c.out(), steps);
  NAPKIN_INTERNAL_CHECK(form, "fusion group {} starts with a contraction but is not a GEMM epilogue", fg.id);
  // The group's outputs: D first (Kernel::output), then a gelu's stored input.
  const bool stores_aux = form->activation == ir::GemmActivation::Gelu && form->aux != ir::kNoValue;
  NAPKIN_INTERNAL_CHECK(k.fused->outputs.size() == (stores_aux ? 2u : 1u) && k.fused->outputs[0].value == form->result &&
                            (!stores_aux || k.fused->outputs[1].value == form->aux),
                        "GEMM epilogue group {} stores other values than D and its aux", fg.id);
  auto input_index = [&](ir::ValueId v) {
    if (v == ir::kNoValue) return -1;
    return static_cast<int>(std::find(fg.inputs.begin(), fg.inputs.end(), v) - fg.inputs.begin());
  };
  NAPKIN_INTERNAL_CHECK(input_index(c.in(0)) == 0 && input_index(c.in(1)) == 1, "a GEMM epilogue's A and B are inputs 0 and 1");
  k.params = ir::loop_params(c.op, c.attrs);
  k.contraction = analysis::contraction_axes(g, c, form->result);
  NAPKIN_INTERNAL_CHECK(analysis::gemm_takes(k.inputs[0].dtype, k.inputs[1].dtype, ir::DType::F32),
                        "the GEMM library takes no {} x {} product", ir::dtype_name(k.inputs[0].dtype),
                        ir::dtype_name(k.inputs[1].dtype));
  k.matmul = analysis::lower_to_gemm(k.contraction);
  const int64_t n = k.output.sizes.back();
  NAPKIN_INTERNAL_CHECK(k.matmul && k.matmul->batch.empty() && !k.matmul->swap_operands && k.matmul->n == n &&
                            k.matmul->c_m_stride == n,
                        "a GEMM epilogue's product is not a plain row-major [rows, n] one (fusion group {})", fg.id);
  k.epilogue = GemmEpilogueOperands{input_index(form->residual), input_index(form->bias), form->activation,
                                    form->activation == ir::GemmActivation::GeluGrad ? input_index(form->aux) : -1,
                                    stores_aux ? 1 : -1};
}

// The kernel of fusion group fg: its inputs and outputs as operands, its
// members as ops over them.
Kernel fused_kernel(const ir::Graph& g, const analysis::MemoryPlan& arena, const ir::FusionGroup& fg) {
  Kernel k;
  FusedLoop f;
  f.shape = fg.shape;
  for (ir::ValueId in : fg.inputs) k.inputs.push_back(operand(g, arena, in));
  std::map<ir::ValueId, int> op_of;  // member result -> op index
  for (ir::NodeId id : fg.nodes) {
    const ir::Node& n = g.node(id);
    FusedOp op{id, n.op, n.attrs, g.value(n.out()).type.dtype, {}};
    for (ir::ValueId in : n.inputs) {
      auto made = op_of.find(in);
      if (made != op_of.end()) {
        op.args.push_back({false, made->second});
        continue;
      }
      auto at = std::find(fg.inputs.begin(), fg.inputs.end(), in);
      NAPKIN_INTERNAL_CHECK(at != fg.inputs.end(), "fusion group {} reads %{}, which is neither its input nor made in it", fg.id, in);
      op.args.push_back({true, static_cast<int>(at - fg.inputs.begin())});
    }
    op_of[n.out()] = static_cast<int>(f.ops.size());
    f.ops.push_back(std::move(op));
    k.node = id;
    k.op = n.op;
    k.attrs = n.attrs;
  }
  std::vector<ir::ValueId> outputs = fg.outputs;
  if (fg.reduction != ir::kNoNode) {  // the elementwise members are the reduction's prologue
    const ir::Node& r = g.node(fg.reduction);
    auto at = std::find(outputs.begin(), outputs.end(), r.out());
    NAPKIN_INTERNAL_CHECK(at != outputs.end(), "fusion group {} ends with a reduction whose result it does not store", fg.id);
    std::rotate(outputs.begin(), at, at + 1);  // the reduction's result is Kernel::output; the stores follow
    k.params = ir::loop_params(r.op, r.attrs);
  }
  for (ir::ValueId out : outputs) {
    f.outputs.push_back(operand(g, arena, out));
    NAPKIN_INTERNAL_CHECK(f.outputs.back().contiguous(), "a fused kernel output must be contiguous");
    f.output_ops.push_back(op_of.at(out));
  }
  NAPKIN_INTERNAL_CHECK(!f.outputs.empty(), "fusion group {} has no output", fg.id);
  k.output = f.outputs[0];
  k.phase = fg.phase;
  k.where = where(g.node(fg.nodes.front()));
  k.fused = std::move(f);
  if (fg.contraction != ir::kNoNode) gemm_with_epilogue(g, fg, k);
  return k;
}

// The kernel of one node.
Kernel node_kernel(const ir::Graph& g, const analysis::MemoryPlan& arena, const ir::Node& n) {
  Kernel k;
  k.node = n.id;
  k.op = n.op;
  k.phase = n.phase;
  k.attrs = n.attrs;
  k.where = where(n);
  for (ir::ValueId in : n.inputs) k.inputs.push_back(operand(g, arena, in));
  k.output = operand(g, arena, n.out());
  for (size_t i = 1; i < n.outputs.size(); ++i) k.extra_outputs.push_back(operand(g, arena, n.out(static_cast<int>(i))));
  return k;
}

}  // namespace

Operand attention_output(const Kernel& k) {
  Operand o = k.output;
  const ir::AttentionParams& p = k.attention();
  NAPKIN_INTERNAL_CHECK(!p.backward && o.sizes.size() == 4, "attention_output of {}", k.name);
  if (p.seq_major_out) {
    std::swap(o.sizes[1], o.sizes[2]);
    std::swap(o.strides[1], o.strides[2]);
  }
  return o;
}

std::vector<Operand> attention_gradients(const Kernel& k) {
  const ir::AttentionParams& p = k.attention();
  NAPKIN_INTERNAL_CHECK(p.backward, "attention_gradients of {}", k.name);
  if (!p.packed_grad) {
    NAPKIN_INTERNAL_CHECK(k.extra_outputs.size() == 2, "attention_grad kernel {} without dk and dv", k.name);
    return {k.output, k.extra_outputs[0], k.extra_outputs[1]};
  }
  // [B, T, 3, H, D] -> for each of 3: [B, H, T, D] with the packed strides, 3 slots apart along dim 2.
  const Operand& g = k.output;
  NAPKIN_INTERNAL_CHECK(g.sizes.size() == 5 && g.sizes[2] == 3, "packed attention gradient of {}", k.name);
  std::vector<Operand> r;
  for (int64_t i = 0; i < 3; ++i) {
    Operand o = g;
    o.sizes = {g.sizes[0], g.sizes[3], g.sizes[1], g.sizes[4]};
    o.strides = {g.strides[0], g.strides[3], g.strides[1], g.strides[4]};
    o.byte_offset = g.byte_offset + i * g.strides[2] * static_cast<int64_t>(ir::dtype_size(g.dtype));
    r.push_back(o);
  }
  return r;
}

runtime::RopeDesc rope_desc(const ir::RopeParams& p, int64_t dim) {
  runtime::RopeDesc d;
  d.style = p.style == ir::RopeStyle::Interleaved ? runtime::RopeStyle::Interleaved : runtime::RopeStyle::Half;
  d.dim = dim;
  d.theta = p.theta;
  d.factor = p.factor;
  d.low_freq_factor = p.low_freq_factor;
  d.high_freq_factor = p.high_freq_factor;
  d.original_context = p.original_context;
  return d;
}

// Every "grad.<param>" output, in the params' order, as the region of the
// arena that holds it. A gradient that is a view covering its whole buffer
// in another order (a permutation) is that buffer.
std::vector<PlannedGradient> planned_gradients(const ir::Graph& g, const analysis::MemoryPlan& arena) {
  std::vector<PlannedGradient> out;
  for (const ir::Param& p : g.params) {
    const std::string& name = g.value(p.value).name;
    ir::ValueId v = g.find_output("grad." + name);
    if (v == ir::kNoValue) continue;
    const ir::Value& value = g.value(v);
    PlannedGradient grad{name, value.type.dtype, arena.offset_of(g, v), value.type.bytes()};
    if (!ir::is_contiguous(value.layout, value.type.sizes())) {
      const ir::Value& storage = g.value(value.storage);
      NAPKIN_INTERNAL_CHECK(storage.type.numel() == value.type.numel() && storage.type.dtype == value.type.dtype,
                            "the gradient of {} is a view on part of a buffer", name);
      grad.byte_offset = arena.offset_of(g, value.storage);
    }
    out.push_back(grad);
  }
  return out;
}

// The bytes an operand spans: from its first element to its last, whatever
// its strides.
std::pair<int64_t, int64_t> span(const Operand& o) {
  int64_t last = 0;
  for (size_t d = 0; d < o.sizes.size(); ++d)
    if (o.sizes[d] > 0) last += (o.sizes[d] - 1) * std::abs(o.strides[d]);
  const int64_t size = static_cast<int64_t>(ir::dtype_size(o.dtype));
  return {o.byte_offset, o.byte_offset + (last + 1) * size};
}

// Each gradient's ready_after: the last kernel before the optimizer that
// writes or reads its bytes. A gradient's buffer is live from its first
// write to the end of the step, so whatever writes there writes that
// gradient; after the last such kernel an all-reduce may change it in
// place while the rest of the backward runs.
void mark_ready(KernelPlan& plan) {
  for (int i = 0; i < plan.num_gradient_kernels; ++i) {
    const Kernel& k = plan.kernels[static_cast<size_t>(i)];
    std::vector<const Operand*> outs{&k.output};
    for (const Operand& o : k.extra_outputs) outs.push_back(&o);
    for (const Operand& o : k.inputs) outs.push_back(&o);
    if (k.fused)
      for (const Operand& o : k.fused->outputs) outs.push_back(&o);
    for (const BatchMember& m : k.batch) {
      for (const Operand& o : m.outputs) outs.push_back(&o);
      for (const Operand& o : m.inputs) outs.push_back(&o);
    }
    for (const Operand* o : outs) {
      const auto [begin, end] = span(*o);
      for (PlannedGradient& grad : plan.gradients)
        if (begin < grad.byte_offset + grad.bytes && grad.byte_offset < end) grad.ready_after = i;
    }
  }
}

// The parameter an update target belongs to (an index in g.params): itself,
// or the parameter whose state it is (Graph::state_param); -1 for shared
// state (the step counter, the loss scale).
int param_of_target(const ir::Graph& g, ir::ValueId target) {
  auto it = g.state_param.find(target);
  const ir::ValueId param = it != g.state_param.end() ? it->second : target;
  for (size_t i = 0; i < g.params.size(); ++i)
    if (g.params[i].value == param) return static_cast<int>(i);
  return -1;
}

// Kernel::serves of every optimizer-phase kernel. Each optimizer node serves
// the parameters whose updates it feeds: those of the updates it computes,
// and those of every node that reads it (so what a node serves includes
// what its readers serve, and skipping a kernel that serves none of a
// rank's parameters starves nothing that rank runs); shared state's update
// (-1) makes a node shared.
void mark_served(const ir::Graph& g, const std::vector<analysis::StepKernel>& steps, KernelPlan& plan) {
  // A flag per param, then one for "shared", packed 64 to a word: a model
  // has a node and a param per layer, so flags one at a time grew with depth squared.
  const size_t n_params = g.params.size(), words = n_params / 64 + 1;
  using Flags = std::vector<uint64_t>;
  auto set = [](Flags& f, size_t i) { f[i / 64] |= uint64_t{1} << (i % 64); };
  auto has = [](const Flags& f, size_t i) { return (f[i / 64] >> (i % 64)) & 1; };
  auto add = [&](Flags& to, const Flags& from) {
    for (size_t w = 0; w < words; ++w) to[w] |= from[w];
  };
  std::map<ir::NodeId, Flags> serves;
  auto of = [&](ir::NodeId id) -> Flags& { return serves.try_emplace(id, words, 0).first->second; };
  for (const ir::Graph::Update& u : g.updates) {
    const ir::NodeId producer = g.value(u.value).producer;
    if (producer == ir::kNoNode || g.node(producer).phase != ir::Phase::Optimizer) continue;
    const int p = param_of_target(g, u.target);
    set(of(producer), p < 0 ? n_params : static_cast<size_t>(p));
  }
  const std::vector<ir::NodeId>& schedule = g.schedule();
  for (auto it = schedule.rbegin(); it != schedule.rend(); ++it) {
    const ir::Node& reader = g.node(*it);
    if (reader.phase != ir::Phase::Optimizer) continue;
    const Flags mine = of(*it);
    for (ir::ValueId in : reader.inputs) {
      const ir::NodeId producer = g.value(in).producer;
      if (producer == ir::kNoNode || g.node(producer).phase != ir::Phase::Optimizer) continue;
      add(of(producer), mine);
    }
  }
  // What a set of nodes serves together; nullopt when shared (or serving
  // nothing, a dead value: run it everywhere).
  auto served_by = [&](const std::vector<ir::NodeId>& nodes) -> std::optional<std::vector<int>> {
    Flags all(words, 0);
    for (ir::NodeId id : nodes)
      if (auto it = serves.find(id); it != serves.end()) add(all, it->second);
    if (has(all, n_params)) return std::nullopt;
    std::vector<int> params;
    for (size_t i = 0; i < n_params; ++i)
      if (has(all, i)) params.push_back(static_cast<int>(i));
    if (params.empty()) return std::nullopt;
    return params;
  };
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    Kernel& k = plan.kernels[i];
    if (k.phase != ir::Phase::Optimizer) continue;
    for (const BatchMember& m : k.batch) k.member_serves.push_back(served_by(m.nodes));
    k.serves = served_by(steps[i].nodes);
  }
}

// Each all_gather issued ahead of its first reader: the kernel that reader
// is in (Kernel::wait_kernel). A gather right before its reader is waited
// for at once.
void mark_waits(const ir::Graph& g, const std::vector<analysis::StepKernel>& steps, KernelPlan& plan) {
  std::map<ir::ValueId, size_t> gathered;  // the gathered value -> its kernel
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    Kernel& k = plan.kernels[i];
    for (ir::NodeId id : steps[i].nodes)
      for (ir::ValueId in : g.node(id).inputs)
        if (auto it = gathered.find(g.value(in).storage); it != gathered.end()) {
          if (it->second + 1 < i) plan.kernels[it->second].wait_kernel = static_cast<int>(i);
          gathered.erase(it);
        }
    if (k.kind == KernelKind::Collective && k.collective().which == ir::Collective::AllGather)
      gathered[g.node(steps[i].nodes.back()).out()] = i;
  }
}

KernelPlan plan_kernels(const ir::Graph& g) {
  analysis::MemoryReport memory = analysis::analyze_memory(g);
  analysis::MemoryPlan arena = analysis::plan_memory(memory);
  KernelPlan plan;
  plan.arena_bytes = arena.arena_bytes;
  plan.liveness_peak = arena.liveness_peak;

  const ir::FusionGroups groups = ir::fusion_groups(g);
  const std::vector<analysis::StepKernel> steps = analysis::step_kernels(g, groups);
  for (const analysis::StepKernel& step : steps) {
    const ir::Node& n = g.node(step.nodes.front());
    const ir::FusionGroup* fg = step.group >= 0 ? &groups.groups[step.group] : nullptr;
    Kernel k;
    if (step.batch >= 0) {
      // One kernel for the batch: its first group's, with every group's operands in `batch`.
      std::vector<BatchMember> members;
      for (int member : groups.batches[step.batch].groups) {
        Kernel m = fused_kernel(g, arena, groups.groups[member]);
        int64_t numel = 1;
        for (int64_t size : m.fused->shape) numel *= size;
        std::vector<ir::NodeId> nodes;
        for (const FusedOp& op : m.fused->ops) nodes.push_back(op.node);
        members.push_back({m.inputs, m.fused->outputs, numel, std::move(nodes)});
        if (members.size() == 1) k = std::move(m);
      }
      k.batch = std::move(members);
      k.node = step.nodes.back();  // the node the time model keys a kernel by (analysis/step_time.h)
    } else if (fg && fg->contraction != ir::kNoNode && fg->reduction != ir::kNoNode) {
      // The contraction's own kernel, which stores the bias gradient (ir/gemm_epilogue.h GemmBiasGrad) besides.
      NAPKIN_INTERNAL_CHECK(fg->nodes.size() == 2 && ir::match_gemm_bias_grad(g, fg->contraction, fg->reduction),
                            "fusion group {} is a GEMM but neither its epilogue nor its bias gradient", fg->id);
      k = node_kernel(g, arena, n);
      k.extra_outputs.push_back(operand(g, arena, g.node(fg->reduction).out()));
      k.bias_grad = fg->reduction;
    } else if (fg) {
      k = fused_kernel(g, arena, *fg);
    } else {
      NAPKIN_INTERNAL_CHECK(n.outputs.size() == 1 || step.kind == KernelKind::Attention || step.kind == KernelKind::Classifier ||
                                step.kind == KernelKind::TopK || step.kind == KernelKind::MoeSlots ||
                                n.op == ir::Op::LayerNormGrad || n.op == ir::Op::RMSNormGrad,
                            "a kernel node must have one output");
      k = node_kernel(g, arena, n);
    }
    k.kind = step.kind;
    k.name = step.name;
    NAPKIN_INTERNAL_CHECK(k.output.contiguous(), "a kernel output must be contiguous");
    if (!k.fused) {
      k.params = ir::loop_params(k.op, k.attrs);
      if (k.kind == KernelKind::Gemm || k.kind == KernelKind::ContractionLoops) k.contraction = analysis::contraction_axes(g, n, n.out());
      if (k.kind == KernelKind::Gemm) k.matmul = analysis::lower_to_gemm(k.contraction);
    }
    NAPKIN_INTERNAL_CHECK(k.bias_grad == ir::kNoNode || (k.kind == KernelKind::Gemm && k.matmul->batch.empty() &&
                                                          !k.matmul->swap_operands),
                          "a bias gradient's GEMM ({}) is not one plain product", k.name);
    if (k.phase == ir::Phase::Setup) {
      NAPKIN_INTERNAL_CHECK(plan.num_setup_kernels == static_cast<int>(plan.kernels.size()),
                            "setup kernels must come first ({})", k.name);
      ++plan.num_setup_kernels;
      ++plan.num_forward_kernels;  // the forward's range ends past the setup's
    }
    if (k.phase == ir::Phase::Forward) {
      NAPKIN_INTERNAL_CHECK(plan.num_forward_kernels == static_cast<int>(plan.kernels.size()),
                            "forward kernels must come first, after the setup's");
      ++plan.num_forward_kernels;
    }
    if (k.phase != ir::Phase::Optimizer) {
      NAPKIN_INTERNAL_CHECK(plan.num_gradient_kernels == static_cast<int>(plan.kernels.size()),
                            "the optimizer's kernels must come last ({})", k.name);
      ++plan.num_gradient_kernels;
    }
    plan.kernels.push_back(std::move(k));
  }
  plan.gradients = planned_gradients(g, arena);
  mark_waits(g, steps, plan);
  mark_ready(plan);
  mark_served(g, steps, plan);

  for (const ir::Graph::Update& u : g.updates) {
    int64_t from = arena.offset_of(g, u.value), to = arena.offset_of(g, u.target);
    if (from == to) continue;  // written in place
    const ir::Value& v = g.value(u.value);
    NAPKIN_INTERNAL_CHECK(ir::is_contiguous(v.layout, v.type.sizes()), "an update copies a non-contiguous view");
    const int p = param_of_target(g, u.target);
    plan.updates.push_back({g.value(u.target).name, from, to, v.type.bytes(),
                            p < 0 ? std::string() : g.value(g.params[static_cast<size_t>(p)].value).name});
  }

  auto add_tensor = [&](ir::ValueId v, TensorRole role) {
    const ir::Value& value = g.value(v);
    PlannedTensor t;
    t.name = value.name;
    t.role = role;
    t.dtype = value.type.dtype;
    t.shape = value.type.sizes();
    t.byte_offset = arena.offset_of(g, v);
    t.bytes = value.type.bytes();
    if (const ir::Param* p = g.find_param(v)) t.init = p->init;
    if (role == TensorRole::State)
      if (const int p = param_of_target(g, v); p >= 0) t.param = g.value(g.params[static_cast<size_t>(p)].value).name;
    plan.tensors.push_back(std::move(t));
  };
  for (const ir::Param& p : g.params) add_tensor(p.value, TensorRole::Param);
  for (ir::ValueId s : g.state) add_tensor(s, TensorRole::State);
  for (ir::ValueId in : g.inputs) add_tensor(in, TensorRole::Input);
  if (g.rng != ir::kNoValue) add_tensor(g.rng, TensorRole::Rng);
  ir::ValueId loss = g.find_output("loss");
  if (loss == ir::kNoValue) {  // an inference graph: its named outputs
    NAPKIN_INTERNAL_CHECK(!g.outputs.empty(), "the graph has neither a loss nor other outputs");
    for (const auto& [name, v] : g.outputs) {
      // The setup's values the prefill and the decode step read
      // (passes/derive_inference.h) are outputs only so the plan keeps them:
      // nothing outside reads them.
      if (name.rfind("setup.", 0) == 0) continue;
      add_tensor(v, TensorRole::Output);
      plan.tensors.back().name = name;
    }
    return plan;
  }
  add_tensor(loss, TensorRole::Loss);
  plan.tensors.back().name = "loss";
  // A training step's metrics ("metric.<name>" outputs: the tokens a moe()
  // layer dropped) are outputs the trainer reads after each forward.
  for (const auto& [name, v] : g.outputs)
    if (name.rfind(ir::kMetricOutputPrefix, 0) == 0) {
      add_tensor(v, TensorRole::Metric);
      plan.tensors.back().name = name;
    }
  return plan;
}

}  // namespace napkin::codegen

namespace napkin::codegen {

void collapse_dims(std::vector<int64_t>& sizes, const std::vector<std::vector<int64_t>*>& strides) {
  std::vector<int64_t> out_sizes;
  std::vector<std::vector<int64_t>> out_strides(strides.size());
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    bool merge = !out_sizes.empty();
    for (size_t o = 0; merge && o < strides.size(); ++o)
      merge = out_strides[o].back() == (*strides[o])[d] * sizes[d];
    if (merge) {
      out_sizes.back() *= sizes[d];
      for (size_t o = 0; o < strides.size(); ++o) out_strides[o].back() = (*strides[o])[d];
      continue;
    }
    out_sizes.push_back(sizes[d]);
    for (size_t o = 0; o < strides.size(); ++o) out_strides[o].push_back((*strides[o])[d]);
  }
  if (out_sizes.empty()) {
    out_sizes.push_back(1);
    for (auto& s : out_strides) s.push_back(0);
  }
  sizes = std::move(out_sizes);
  for (size_t o = 0; o < strides.size(); ++o) *strides[o] = std::move(out_strides[o]);
}

std::vector<int64_t> broadcast_strides(const Operand& o, const std::vector<int64_t>& to) {
  std::vector<int64_t> s(to.size(), 0);
  int shift = static_cast<int>(to.size()) - static_cast<int>(o.sizes.size());
  NAPKIN_INTERNAL_CHECK(shift >= 0, "broadcast to a lower rank");
  for (size_t d = 0; d < o.sizes.size(); ++d)
    if (o.sizes[d] != 1) s[d + shift] = o.strides[d];
  return s;
}

int normalize_axis(int64_t axis, size_t rank) {
  return static_cast<int>(axis < 0 ? axis + static_cast<int64_t>(rank) : axis);
}

ReductionLoop reduction_loop(const Kernel& k) {
  const Operand& out = k.output;
  ReductionLoop loop;
  loop.sizes = k.fused ? k.fused->shape : k.inputs[0].sizes;
  if (k.fused) {
    for (const Operand& in : k.inputs) loop.inputs.push_back(broadcast_strides(in, loop.sizes));
    for (size_t o = 1; o < k.fused->outputs.size(); ++o) loop.stores.push_back(k.fused->outputs[o].strides);
  } else
    loop.inputs.push_back(k.inputs[0].strides);
  size_t rank = loop.sizes.size();
  std::vector<bool> reduced(rank, false);
  for (int64_t a : k.reduction().axes) reduced[normalize_axis(a, rank)] = true;
  bool keepdims = k.reduction().keepdims;
  loop.out_strides.assign(rank, 0);
  for (size_t d = 0, o = 0; d < rank; ++d) {
    if (!reduced[d]) loop.out_strides[d] = out.strides[o];
    if (!reduced[d] || keepdims) ++o;
  }
  std::vector<std::vector<int64_t>*> all{&loop.out_strides};
  for (auto& in : loop.inputs) all.push_back(&in);
  for (auto& st : loop.stores) all.push_back(&st);
  collapse_dims(loop.sizes, all);
  loop.in_strides = loop.inputs.empty() ? std::vector<int64_t>(loop.sizes.size(), 0) : loop.inputs[0];
  return loop;
}

RowLoop row_loop(const Kernel& k) {
  using ir::RowVariant;
  const ir::RowParams& p = k.rows();
  const Operand& x = k.inputs[0];
  RowLoop loop;
  loop.axis = normalize_axis(p.axis, x.sizes.size());
  loop.n = x.sizes.empty() ? 1 : x.sizes[loop.axis];
  auto add = [&](const Operand& o, RowShape shape, bool input = true) { loop.operands.push_back({&o, shape, input, {}, 0}); };
  add(x, RowShape::Full);
  switch (p.variant) {
    case RowVariant::Softmax:
    case RowVariant::LogSoftmax: break;
    case RowVariant::Norm:
      add(k.inputs[1], RowShape::Vector);
      if (p.centered) add(k.inputs[2], RowShape::Vector);
      break;
    case RowVariant::NormGrad:
      add(k.inputs[1], RowShape::Vector), add(k.inputs[2], RowShape::Full);
      if (k.inputs.size() > 3) add(k.inputs[3], RowShape::Full);  // the residual added to dx
      break;
    case RowVariant::SoftmaxGrad: add(k.inputs[1], RowShape::Full); break;
    case RowVariant::CrossEntropy:
    case RowVariant::CrossEntropyGrad: add(k.inputs[1], RowShape::PerRow); break;
  }
  if (p.variant != RowVariant::CrossEntropy) add(k.output, RowShape::Full, false);
  if (p.variant == RowVariant::NormGrad)  // the gains' gradients (NormGrad with gains)
    for (const Operand& o : k.extra_outputs) add(o, RowShape::Vector, false);

  for (size_t d = 0; d < x.sizes.size(); ++d)
    if (static_cast<int>(d) != loop.axis) loop.sizes.push_back(x.sizes[d]);
  for (RowOperand& r : loop.operands) {
    const Operand& o = *r.op;
    switch (r.shape) {
      case RowShape::Full:
        for (size_t d = 0; d < o.sizes.size(); ++d) {
          if (static_cast<int>(d) == loop.axis) r.step = o.strides[d];
          else r.strides.push_back(o.strides[d]);
        }
        break;
      case RowShape::PerRow: r.strides = broadcast_strides(o, loop.sizes); break;
      case RowShape::Vector:
        r.strides.assign(loop.sizes.size(), 0);
        r.step = o.sizes.empty() ? 0 : o.strides.back();
        break;
    }
  }
  std::vector<std::vector<int64_t>*> all;
  for (RowOperand& r : loop.operands) all.push_back(&r.strides);
  collapse_dims(loop.sizes, all);
  return loop;
}

EmbeddingLoop embedding_loop(const Kernel& k) {
  const bool grad = k.kind == KernelKind::ScatterAdd;
  const Operand& ids = k.inputs[1];
  const Operand& table = grad ? k.output : k.inputs[0];
  const Operand& dense = grad ? k.inputs[0] : k.output;
  const size_t id_rank = ids.sizes.size();
  EmbeddingLoop loop;
  loop.vocab = table.sizes[0];
  loop.id_sizes = ids.sizes;
  loop.id_strides = ids.strides;
  loop.dense_id_strides.assign(dense.strides.begin(), dense.strides.begin() + id_rank);
  collapse_dims(loop.id_sizes, {&loop.id_strides, &loop.dense_id_strides});
  loop.row_sizes.assign(table.sizes.begin() + 1, table.sizes.end());
  loop.row_table.assign(table.strides.begin() + 1, table.strides.end());
  loop.row_dense.assign(dense.strides.begin() + id_rank, dense.strides.end());
  collapse_dims(loop.row_sizes, {&loop.row_table, &loop.row_dense});
  return loop;
}

}  // namespace napkin::codegen
