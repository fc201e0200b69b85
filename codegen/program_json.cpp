#include "codegen/program_json.h"

#include "ir/internal_check.h"

#include <algorithm>
#include <map>

#include "analysis/cost.h"
#include "analysis/devices.h"
#include "analysis/distributed.h"

namespace napkin::codegen {

namespace {

runtime::InitKind init_kind(ir::InitSpec::Kind k) {
  switch (k) {
    case ir::InitSpec::Kind::Zeros: return runtime::InitKind::Zeros;
    case ir::InitSpec::Kind::Ones: return runtime::InitKind::Ones;
    case ir::InitSpec::Kind::Constant: return runtime::InitKind::Constant;
    case ir::InitSpec::Kind::Normal: return runtime::InitKind::Normal;
    case ir::InitSpec::Kind::TruncNormal:
    case ir::InitSpec::Kind::Xavier: return runtime::InitKind::TruncNormal;  // a truncated normal with derived std and cuts
  }
  return runtime::InitKind::Zeros;
}

runtime::DType runtime_dtype(ir::DType t) { return runtime::parse_dtype(ir::dtype_name(t)); }

// A Gemm kernel as runtime/gemm.h runs it, with its epilogue
// (codegen/plan.h GemmEpilogueOperands: where D, the residual and the bias
// are, -1: none) and its bias gradient.
runtime::MatmulSpec matmul_spec(const Kernel& k, const Launch& launch) {
  const MatmulLowering& m = *k.matmul;
  const Operand &a = k.inputs[m.swap_operands ? 1 : 0], &b = k.inputs[m.swap_operands ? 0 : 1];
  runtime::MatmulSpec s;
  s.a = a.byte_offset, s.b = b.byte_offset, s.c = k.output.byte_offset;
  s.a_dtype = runtime_dtype(a.dtype), s.b_dtype = runtime_dtype(b.dtype);
  // With an epilogue the GEMM's C is its f32 sums, which go to the epilogue, not to memory.
  s.c_dtype = runtime_dtype(k.epilogue ? ir::DType::F32 : k.output.dtype);
  s.desc = {m.batch, m.a_batch_stride, m.b_batch_stride, m.c_batch_stride, m.m, m.n, m.k,
            m.a_m_stride, m.a_k_stride, m.b_k_stride, m.b_n_stride, m.c_m_stride};
  if (k.epilogue) {
    auto offset = [&](int input) { return input < 0 ? int64_t{-1} : k.inputs[input].byte_offset; };
    const GemmEpilogueOperands& e = *k.epilogue;
    runtime::GemmEpilogueSpec& ep = s.epilogue.emplace();
    ep.d = k.output.byte_offset, ep.d_dtype = runtime_dtype(k.output.dtype);
    ep.residual = offset(e.residual), ep.bias = offset(e.bias);
    ep.activation = e.activation == ir::GemmActivation::Gelu       ? runtime::GemmActivation::Gelu
                    : e.activation == ir::GemmActivation::GeluGrad ? runtime::GemmActivation::GeluGrad
                                                                   : runtime::GemmActivation::None;
    // The gelu's input: stored (gelu) or read (gelu_grad), in D's dtype, n elements a row like D.
    ep.aux = e.aux_output >= 0 ? k.fused->outputs[e.aux_output].byte_offset : offset(e.aux_input);
    ep.rows = launch.extent;
  }
  // A weight gradient's GEMM that also sums B over k into the bias gradient (f32 [n]).
  if (k.bias_grad != ir::kNoNode) s.bias_grad = k.extra_outputs.at(0).byte_offset;
  return s;
}

// A Classifier kernel as runtime/classifier.h's descriptor and its operands'
// byte offsets (x, w, targets, then lse and dloss backward; the outputs).
runtime::ClassifierSpec classifier_spec(const Kernel& k) {
  const Operand &x = k.inputs[0], &w = k.inputs[1], &t = k.inputs[2];
  const int64_t d = x.sizes.back(), rows = x.numel() / d;
  // x's rows must be one stride apart: the plan's operand of a contiguous value (the pass makes it one).
  NAPKIN_INTERNAL_CHECK(x.contiguous() && t.contiguous() && w.sizes.size() == 2,
                        "classifier operands must be contiguous x and targets and a 2-D w ({})", k.name);
  runtime::ClassifierSpec s;
  s.backward = k.classifier().backward, s.dtype = runtime_dtype(x.dtype);
  s.desc = {rows, w.sizes[0], d, d, w.strides[0], w.strides[1], t.dtype == ir::DType::I64};
  s.x = x.byte_offset, s.w = w.byte_offset, s.targets = t.byte_offset;
  if (s.backward) {
    s.lse = k.inputs[3].byte_offset, s.dloss = k.inputs[4].byte_offset;
    s.dx = k.output.byte_offset, s.dw = k.extra_outputs.at(0).byte_offset;
  } else {
    s.loss = k.output.byte_offset, s.lse = k.extra_outputs.at(0).byte_offset;
  }
  return s;
}

// An attention operand's offset and (batch, head, row) strides; head_dim's stride is 1.
int64_t attention_operand(const Operand& o, runtime::AttentionDesc::Strides& strides) {
  NAPKIN_INTERNAL_CHECK(o.strides.size() == 4 && (o.strides[3] == 1 || o.sizes[3] == 1),
                        "an attention operand must be 4-D and contiguous along head_dim");
  strides = {o.strides[0], o.strides[1], o.strides[2]};
  return o.byte_offset;
}

// An Attention kernel as runtime/attention.h's descriptor and its operands.
runtime::AttentionSpec attention_spec(const Kernel& k) {
  const ir::AttentionParams& p = k.attention();
  const Operand &q = k.inputs[0], &kv = k.inputs[1];
  runtime::AttentionSpec s;
  runtime::AttentionDesc& d = s.desc;
  s.backward = p.backward, s.dtype = runtime_dtype(q.dtype);
  d.causal = p.causal, d.scale = p.scale;
  d.batch = q.sizes[0], d.heads = q.sizes[1], d.kv_heads = kv.sizes[1];
  d.q_len = q.sizes[2], d.kv_len = kv.sizes[2], d.head_dim = q.sizes[3];
  if (p.rope) d.rope = rope_desc(*p.rope, d.head_dim);
  s.q = attention_operand(q, d.q), s.k = attention_operand(kv, d.k), s.v = attention_operand(k.inputs[2], d.v);
  if (!p.backward) {
    s.o = attention_operand(attention_output(k), d.o), s.lse = k.extra_outputs.at(0).byte_offset;
    return s;
  }
  s.o = attention_operand(k.inputs[3], d.o), s.lse = k.inputs[4].byte_offset;
  const std::vector<Operand> grads = attention_gradients(k);
  s.d_o = attention_operand(k.inputs[5], d.d_o), s.dq = attention_operand(grads[0], d.dq);
  s.dk = attention_operand(grads[1], d.dk), s.dv = attention_operand(grads[2], d.dv);
  return s;
}

// A CachedAttention kernel as runtime/cached_attention.h's descriptor: the
// attention operands, the caches and where the positions are.
runtime::CachedAttentionSpec cached_attention_spec(const Kernel& k) {
  const Operand &q = k.inputs[0], &kv = k.inputs[1], &cache = k.inputs[3], &positions = k.inputs[5];
  NAPKIN_INTERNAL_CHECK(positions.contiguous(), "cached attention positions must be contiguous ({})", k.name);
  runtime::CachedAttentionSpec s;
  runtime::CachedAttentionDesc& d = s.desc;
  s.dtype = runtime_dtype(q.dtype), d.scale = k.cached_attention().scale;
  d.batch = q.sizes[0], d.heads = q.sizes[1], d.kv_heads = kv.sizes[1];
  d.rows = q.sizes[2], d.context = cache.sizes[2], d.head_dim = q.sizes[3];
  d.positions_i64 = positions.dtype == ir::DType::I64;
  if (const std::optional<ir::RopeParams>& rope = k.cached_attention().rope) d.rope = rope_desc(*rope, d.head_dim);
  s.q = attention_operand(q, d.q), s.k = attention_operand(kv, d.k), s.v = attention_operand(k.inputs[2], d.v);
  s.k_cache = attention_operand(cache, d.k_cache), s.v_cache = attention_operand(k.inputs[4], d.v_cache);
  s.o = attention_operand(k.output, d.o), s.positions = positions.byte_offset;
  return s;
}

// A Rope kernel as runtime/rope.h's kernel descriptor: x's sizes and
// strides (any), y contiguous, and where the explicit positions are.
runtime::RopeSpec rope_spec(const Kernel& k) {
  const ir::RopeParams& p = k.rope();
  const Operand& x = k.inputs[0];
  runtime::RopeSpec s;
  s.dtype = runtime_dtype(x.dtype);
  runtime::RopeKernelDesc& d = s.desc;
  d.rope = rope_desc(p, x.sizes[static_cast<size_t>(p.axis)]);
  d.inverse = p.inverse;
  d.sizes = x.sizes, d.x_strides = x.strides;
  d.axis = p.axis, d.seq_axis = p.seq_axis;
  s.x = x.byte_offset, s.y = k.output.byte_offset;
  if (p.explicit_positions) {
    const Operand& positions = k.inputs.at(1);
    d.explicit_positions = true;
    d.positions_i64 = positions.dtype == ir::DType::I64;
    // The frontend gives the op contiguous positions (Builder::unit_inner_stride).
    NAPKIN_INTERNAL_CHECK(positions.contiguous(), "rope kernel {}: positions must be contiguous", k.name);
    s.positions = positions.byte_offset;
  }
  return s;
}

// A Collective kernel: its input and output (contiguous, one dtype, the same
// count; the memory plan may give them the same bytes), and for ZeRO-3's the
// parameter whose owner the ranks meet at (the pass's `param` attribute).
runtime::CollectiveSpec collective_spec(const Kernel& k) {
  const Operand& x = k.inputs.at(0);
  NAPKIN_INTERNAL_CHECK(x.dtype == k.output.dtype && x.contiguous() && k.output.contiguous() &&
                            x.numel() == k.output.numel(),
                        "collective kernel {}: its input is not the output's count of contiguous elements", k.name);
  const ir::Collective which = k.collective().which;
  NAPKIN_INTERNAL_CHECK(which != ir::Collective::AllReduceSum || x.dtype == ir::DType::F32,
                        "all-reduce kernel {}: not f32", k.name);
  return {.collective = std::string(ir::collective_name(which)),
          .x = x.byte_offset,
          .y = k.output.byte_offset,
          .count = x.numel(),
          .dtype = runtime_dtype(x.dtype),
          .param = which == ir::Collective::AllReduceSum ? std::string() : k.attrs.get_string("param"),
          .wait = k.wait_kernel};
}

// A TopK kernel: x's sizes and strides (any), the values and indices contiguous.
runtime::TopKSpec top_k_spec(const Kernel& k) {
  const Operand& x = k.inputs.at(0);
  NAPKIN_INTERNAL_CHECK(k.extra_outputs.size() == 1 && k.extra_outputs[0].contiguous(), "top_k kernel {}: its indices",
                        k.name);
  runtime::TopKSpec s;
  s.dtype = runtime_dtype(x.dtype);
  s.desc.sizes = x.sizes, s.desc.x_strides = x.strides, s.desc.k = k.top_k().k;
  s.x = x.byte_offset, s.values = k.output.byte_offset, s.indices = k.extra_outputs[0].byte_offset;
  return s;
}

// A MoeSlots kernel: the indices [T, k] by their strides, the results contiguous.
runtime::MoeSlotsSpec moe_slots_spec(const Kernel& k) {
  const Operand& indices = k.inputs.at(0);
  NAPKIN_INTERNAL_CHECK(k.extra_outputs.size() == 2 && k.extra_outputs[0].contiguous() && k.extra_outputs[1].contiguous(),
                        "moe_slots kernel {}: its src and counts", k.name);
  const ir::MoeSlotsParams& p = k.moe_slots();
  runtime::MoeSlotsSpec s;
  s.desc = {.tokens = indices.sizes.at(0), .k = indices.sizes.at(1), .experts = p.experts, .capacity = p.capacity,
            .index_strides = indices.strides};
  s.indices = indices.byte_offset, s.pos = k.output.byte_offset;
  s.src = k.extra_outputs[0].byte_offset, s.counts = k.extra_outputs[1].byte_offset;
  return s;
}

// The names of parameters by their index in g.params.
std::vector<std::string> param_names(const ir::Graph& g, const std::vector<int>& params) {
  std::vector<std::string> out;
  for (int i : params) out.push_back(g.value(g.params[static_cast<size_t>(i)].value).name);
  return out;
}

// A generated loop function's launch; in the optimizer phase, a batch's
// members with their work and what each serves.
runtime::LoopSpec loop_spec(const ir::Graph& g, const Kernel& k, const Launch& launch) {
  runtime::LoopSpec s{.extent = launch.extent, .parallel = launch.parallel, .combine = launch.combine};
  const std::vector<int64_t>& work = launch.member_work;
  if (k.phase != ir::Phase::Optimizer || work.empty() || work.size() != k.member_serves.size()) return s;
  for (size_t m = 0; m < work.size(); ++m) {
    const std::optional<std::vector<int>>& serves = k.member_serves[m];
    s.members.push_back({work[m], serves ? param_names(g, *serves) : std::vector<std::string>(), !serves});
  }
  return s;
}

// The kernel's payload: what the runtime runs it as (a library or runtime
// call, or the generated loop function).
runtime::KernelPayload payload(const ir::Graph& g, const Kernel& k, const Launch& launch) {
  switch (k.kind) {
    case KernelKind::Gemm: return matmul_spec(k, launch);
    case KernelKind::Attention: return attention_spec(k);
    case KernelKind::Classifier: return classifier_spec(k);
    case KernelKind::CachedAttention: return cached_attention_spec(k);
    case KernelKind::Rope: return rope_spec(k);
    case KernelKind::Collective: return collective_spec(k);
    case KernelKind::TopK: return top_k_spec(k);
    case KernelKind::MoeSlots: return moe_slots_spec(k);
    case KernelKind::Fill:
    case KernelKind::Elementwise:
    case KernelKind::FusedElementwise:
    case KernelKind::Reduction:
    case KernelKind::ContractionLoops:
    case KernelKind::Concat:
    case KernelKind::Gather:
    case KernelKind::ScatterAdd:
    case KernelKind::Rows:
    case KernelKind::Mse: return loop_spec(g, k, launch);
  }
  NAPKIN_INTERNAL_CHECK(false, "kernel {} has no payload", k.name);
  return {};
}

runtime::TrainDefaults train_defaults(const ir::Graph& g) {
  const ir::TrainConfig& t = g.config.train;
  const ir::OptimizerConfig& o = g.config.optimizer;
  runtime::TrainDefaults d;
  d.steps = t.steps, d.seed = t.seed, d.accumulate = t.accumulate;
  if (t.has_data)
    d.data = {t.data.format, t.data.path, t.data.token_dtype, t.data.order, t.data.files, t.data.split,
              t.data.tokenizer};
  d.eval_every = t.eval_every, d.eval_batches = t.eval_batches;
  d.checkpoint_every = t.checkpoint_every, d.checkpoint_keep = t.checkpoint_keep, d.checkpoint_dir = t.checkpoint_dir;
  d.log_every = t.log_every, d.metrics = t.metrics_path;
  d.optimizer = ir::optimizer_name(o.kind), d.precision = ir::precision_name(g.config.precision.policy);
  d.lr = o.lr;
  d.schedule = {o.schedule, o.warmup_steps, t.steps, o.lr, o.min_lr};
  d.dims = t.dims, d.memory_budget = t.memory_budget;
  return d;
}

// Per graph input whose values index something, the count its ids must stay
// below: the rows of an embedding's table, the classes of a cross-entropy's
// logits. The trainer's data loader checks every id against it, so an id out
// of range is an error naming the file and the position, not a kernel's.
// Views (a reshape of the targets) index through their storage.
std::map<std::string, int64_t> index_bounds(const ir::Graph& g) {
  std::map<ir::ValueId, int64_t> by_value;
  for (ir::NodeId id : g.schedule()) {
    const ir::Node& n = g.node(id);
    int ids = -1;
    int64_t bound = 0;
    switch (n.op) {
      case ir::Op::Embedding:  // (table [V, ...], ids)
        ids = 1, bound = g.value(n.in(0)).type.sizes().at(0);
        break;
      case ir::Op::CrossEntropy:  // (logits [..., V], targets)
        ids = 1, bound = g.value(n.in(0)).type.sizes().back();
        break;
      case ir::Op::LinearCrossEntropy:  // (x [..., d], w [V, d], targets)
        ids = 2, bound = g.value(n.in(1)).type.sizes().at(0);
        break;
      default:
        continue;
    }
    const ir::ValueId storage = g.value(n.in(ids)).storage;
    auto [it, fresh] = by_value.emplace(storage, bound);
    if (!fresh) it->second = std::min(it->second, bound);
  }
  std::map<std::string, int64_t> bounds;
  for (ir::ValueId in : g.inputs)
    if (auto it = by_value.find(in); it != by_value.end()) bounds[g.value(in).name] = it->second;
  return bounds;
}

runtime::PredictedStep predicted_step(const analysis::StepTime& t) {
  if (!t.device) return {};
  runtime::PredictedStep p{true, t.seconds, t.launch_seconds, t.mfu, t.kernels_without_peak, {}};
  for (int c = 0; c < analysis::kNumKernelClasses; ++c)
    p.class_seconds[std::string(analysis::kernel_class_name(static_cast<analysis::KernelClass>(c)))] = t.class_seconds[c];
  return p;
}

}  // namespace

ProgramFacts step_facts(const ir::Graph& g, const std::string& device, const std::string& model_hash,
                        const std::string& backend, bool allow_tf32) {
  const analysis::Device* d = analysis::find_device(device);
  analysis::StepCost cost = analysis::analyze_step(g, d);
  ProgramFacts facts;
  facts.model_hash = model_hash;
  facts.flops_per_step = cost.total.flops;
  facts.flops_forward = cost.phase(ir::Phase::Forward).flops;
  facts.flops_optimizer = cost.phase(ir::Phase::Optimizer).flops;
  facts.tokens_per_step = static_cast<int64_t>(cost.tokens);
  facts.device = device;
  facts.peak_flops = d ? analysis::matmul_peak(*d, cost.matmul_dtype, allow_tf32) : 0;
  facts.backend = backend;
  if (d) {
    facts.peak_source = d->source_of(analysis::peak_figure_name(*d, cost.matmul_dtype, allow_tf32));
    facts.device_file = analysis::local_origin(*d);
    facts.predicted = analysis::predict_step_time(g, cost, *d, allow_tf32);
  }
  return facts;
}

runtime::Program describe_program(const ir::Graph& g, const KernelPlan& plan, const std::vector<Launch>& launches,
                                  const ProgramFacts& facts) {
  runtime::Program p;
  p.model = g.name, p.hash = facts.model_hash, p.backend = facts.backend, p.device = facts.device;
  p.arena_bytes = plan.arena_bytes, p.liveness_peak = plan.liveness_peak;
  p.flops_per_step = facts.flops_per_step, p.flops_forward = facts.flops_forward;
  p.flops_optimizer = facts.flops_optimizer, p.peak_flops = facts.peak_flops;
  p.peak_source = facts.peak_source, p.device_file = facts.device_file;
  p.predicted = predicted_step(facts.predicted);
  p.tokens_per_step = facts.tokens_per_step;
  const std::map<std::string, int64_t> bounds = index_bounds(g);
  for (const PlannedTensor& t : plan.tensors) {
    runtime::TensorSpec& s = p.tensors.emplace_back();
    s.name = t.name, s.role = t.role, s.dtype = runtime_dtype(t.dtype), s.shape = t.shape;
    s.offset = t.byte_offset, s.bytes = t.bytes;
    if (t.role == TensorRole::State) s.param = t.param;
    if (auto b = bounds.find(t.name); t.role == TensorRole::Input && b != bounds.end()) s.index_bound = b->second;
    if (t.role == TensorRole::Param) s.init = {init_kind(t.init.kind), t.init.value, t.init.std, t.init.lo, t.init.hi};
  }
  // The time model's kernels are the plan's (analysis/step_kernels.h), one for one.
  const std::vector<analysis::KernelTime>& predicted = facts.predicted.kernels;
  NAPKIN_INTERNAL_CHECK(predicted.empty() || predicted.size() == plan.kernels.size(),
                        "the time model has {} kernels, the plan {}", predicted.size(), plan.kernels.size());
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const Kernel& k = plan.kernels[i];
    runtime::KernelSpec& s = p.kernels.emplace_back();
    s.name = k.name, s.where = k.where, s.phase = runtime::parse_phase(ir::phase_name(k.phase));
    s.payload = payload(g, k, launches.at(i));
    s.out_offset = k.output.byte_offset, s.out_numel = k.output.numel(), s.out_dtype = runtime_dtype(k.output.dtype);
    // In the optimizer phase, a kernel serves the parameters it names; none: shared, every rank runs it.
    if (k.phase == ir::Phase::Optimizer && k.serves) s.serves = param_names(g, *k.serves), s.shared = false;
    if (!predicted.empty()) {
      const analysis::KernelTime& t = predicted[i];
      s.kernel_class = analysis::kernel_class_name(t.kind);
      s.flops = t.flops, s.bytes = t.bytes;
      s.predicted_seconds = t.no_peak ? -1 : t.seconds;
    }
  }
  p.num_setup_kernels = plan.num_setup_kernels, p.num_forward_kernels = plan.num_forward_kernels;
  p.num_gradient_kernels = plan.num_gradient_kernels;
  for (const PlannedGradient& grad : plan.gradients)
    p.gradients.push_back({grad.param, runtime_dtype(grad.dtype), grad.byte_offset, grad.bytes, grad.ready_after});
  p.bucket_bytes = analysis::kBucketBytes;
  for (const UpdateCopy& u : plan.updates) p.updates.push_back({u.target, u.from, u.to, u.bytes, u.param});
  p.train = train_defaults(g);
  return p;
}

std::string program_json(const ir::Graph& g, const KernelPlan& plan, const std::vector<Launch>& launches,
                         const ProgramFacts& facts) {
  return runtime::program_json(describe_program(g, plan, launches, facts));
}

std::string training_settings_json(const ir::Graph& g) { return runtime::train_defaults_json(train_defaults(g)); }

}  // namespace napkin::codegen
