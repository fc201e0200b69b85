#include "codegen/program_json.h"

#include "ir/internal_check.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

#include "analysis/cost.h"
#include "analysis/devices.h"
#include "analysis/distributed.h"

namespace napkin::codegen {

namespace {

using nlohmann::json;

const char* init_kind(ir::InitSpec::Kind k) {
  switch (k) {
    case ir::InitSpec::Kind::Zeros: return "zeros";
    case ir::InitSpec::Kind::Ones: return "ones";
    case ir::InitSpec::Kind::Constant: return "constant";
    case ir::InitSpec::Kind::Normal: return "normal";
    case ir::InitSpec::Kind::TruncNormal: return "trunc_normal";
    case ir::InitSpec::Kind::Xavier: return "trunc_normal";  // a truncated normal with derived std and cuts
  }
  return "?";
}

json operand_json(const Operand& o) {
  return {{"offset", o.byte_offset}, {"dtype", std::string(ir::dtype_name(o.dtype))}, {"numel", o.numel()}};
}

// A Gemm's epilogue (codegen/plan.h GemmEpilogueOperands): where D, the
// residual and the bias are (-1: none), and D's dtype; null without one.
json epilogue_json(const Kernel& k) {
  if (!k.epilogue) return nullptr;
  auto offset = [&](int input) { return input < 0 ? int64_t{-1} : k.inputs[input].byte_offset; };
  const GemmEpilogueOperands& e = *k.epilogue;
  const char* activation = e.activation == ir::GemmActivation::Gelu       ? "gelu"
                           : e.activation == ir::GemmActivation::GeluGrad ? "gelu_grad"
                                                                          : "none";
  // The gelu's input: stored (gelu) or read (gelu_grad), in D's dtype, n elements a row like D.
  const int64_t aux = e.aux_output >= 0 ? k.fused->outputs[e.aux_output].byte_offset : offset(e.aux_input);
  return {{"d", k.output.byte_offset},
          {"d_dtype", std::string(ir::dtype_name(k.output.dtype))},
          {"residual", offset(e.residual)},
          {"bias", offset(e.bias)},
          {"activation", activation},
          {"aux", aux}};
}

json matmul_json(const Kernel& k) {
  const MatmulLowering& m = *k.matmul;
  const Operand& a = k.inputs[m.swap_operands ? 1 : 0];
  const Operand& b = k.inputs[m.swap_operands ? 0 : 1];
  return {{"a", a.byte_offset},
          {"b", b.byte_offset},
          {"c", k.output.byte_offset},
          {"a_dtype", std::string(ir::dtype_name(a.dtype))},
          {"b_dtype", std::string(ir::dtype_name(b.dtype))},
          // With an epilogue the GEMM's C is its f32 sums, which go to the epilogue, not to memory.
          {"c_dtype", std::string(ir::dtype_name(k.epilogue ? ir::DType::F32 : k.output.dtype))},
          {"batch", m.batch},
          {"a_batch_stride", m.a_batch_stride},
          {"b_batch_stride", m.b_batch_stride},
          {"c_batch_stride", m.c_batch_stride},
          {"m", m.m},
          {"n", m.n},
          {"k", m.k},
          {"a_m_stride", m.a_m_stride},
          {"a_k_stride", m.a_k_stride},
          {"b_k_stride", m.b_k_stride},
          {"b_n_stride", m.b_n_stride},
          {"c_m_stride", m.c_m_stride},
          {"epilogue", epilogue_json(k)},
          // A weight gradient's GEMM that also sums B over k into the bias gradient (f32 [n]); -1: none.
          {"bias_grad", k.bias_grad == ir::kNoNode ? int64_t{-1} : k.extra_outputs.at(0).byte_offset}};
}

// How the runtime runs a kernel: a library or runtime call by name, or the
// generated loop function.
const char* runtime_kind(KernelKind kind) {
  switch (kind) {
    case KernelKind::Gemm: return "matmul";
    case KernelKind::Attention: return "attention";
    case KernelKind::Classifier: return "classifier";
    case KernelKind::CachedAttention: return "cached_attention";
    default: return "loop";
  }
}

// A Classifier kernel as runtime/classifier.h's descriptor and its operands'
// byte offsets (x, w, targets, then lse and dloss backward; the outputs).
json classifier_json(const Kernel& k) {
  const Operand &x = k.inputs[0], &w = k.inputs[1], &t = k.inputs[2];
  const int64_t d = x.sizes.back(), rows = x.numel() / d;
  // x's rows must be one stride apart: the plan's operand of a contiguous value (the pass makes it one).
  NAPKIN_INTERNAL_CHECK(x.contiguous() && t.contiguous() && w.sizes.size() == 2,
                        "classifier operands must be contiguous x and targets and a 2-D w ({})", k.name);
  const bool backward = k.classifier().backward;
  json j = {{"backward", backward},
            {"dtype", std::string(ir::dtype_name(x.dtype))},
            {"rows", rows},
            {"vocab", w.sizes[0]},
            {"d", d},
            {"x_row_stride", d},
            {"w_v_stride", w.strides[0]},
            {"w_d_stride", w.strides[1]},
            {"targets_i64", t.dtype == ir::DType::I64},
            {"x", x.byte_offset},
            {"w", w.byte_offset},
            {"targets", t.byte_offset}};
  if (backward) {
    j["lse"] = k.inputs[3].byte_offset;
    j["dloss"] = k.inputs[4].byte_offset;
    j["dx"] = k.output.byte_offset;
    j["dw"] = k.extra_outputs.at(0).byte_offset;
  } else {
    j["loss"] = k.output.byte_offset;
    j["lse"] = k.extra_outputs.at(0).byte_offset;
  }
  return j;
}

// An attention operand as runtime/program.cpp reads it: [offset, batch
// stride, head stride, row stride]; head_dim's stride is 1.
json attention_operand(const Operand& o) {
  NAPKIN_INTERNAL_CHECK(o.strides.size() == 4 && (o.strides[3] == 1 || o.sizes[3] == 1),
                        "an attention operand must be 4-D and contiguous along head_dim");
  return json{o.byte_offset, o.strides[0], o.strides[1], o.strides[2]};
}

// An Attention kernel as runtime/attention.h's descriptor: each operand's
// offset and (batch, head, row) strides; head_dim's stride is 1.
json attention_json(const Kernel& k) {
  const ir::AttentionParams& p = k.attention();
  const Operand &q = k.inputs[0], &kv = k.inputs[1];
  json j = {{"backward", p.backward},
            {"causal", p.causal},
            {"scale", p.scale},
            {"dtype", std::string(ir::dtype_name(q.dtype))},
            {"batch", q.sizes[0]},
            {"heads", q.sizes[1]},
            {"kv_heads", kv.sizes[1]},
            {"q_len", q.sizes[2]},
            {"kv_len", kv.sizes[2]},
            {"head_dim", q.sizes[3]},
            {"q", attention_operand(k.inputs[0])},
            {"k", attention_operand(k.inputs[1])},
            {"v", attention_operand(k.inputs[2])}};
  if (!p.backward) {
    j["o"] = attention_operand(attention_output(k));
    j["lse"] = k.extra_outputs.at(0).byte_offset;
  } else {
    j["o"] = attention_operand(k.inputs[3]);
    j["lse"] = k.inputs[4].byte_offset;
    j["do"] = attention_operand(k.inputs[5]);
    const std::vector<Operand> grads = attention_gradients(k);
    j["dq"] = attention_operand(grads[0]);
    j["dk"] = attention_operand(grads[1]);
    j["dv"] = attention_operand(grads[2]);
  }
  return j;
}

// A CachedAttention kernel as runtime/cached_attention.h's descriptor: the
// attention operands' offsets and strides as attention_json writes them, the
// caches' too, and where the positions are.
json cached_attention_json(const Kernel& k) {
  const Operand &q = k.inputs[0], &kv = k.inputs[1], &cache = k.inputs[3], &positions = k.inputs[5];
  NAPKIN_INTERNAL_CHECK(positions.contiguous(), "cached attention positions must be contiguous ({})", k.name);
  return {{"scale", k.cached_attention().scale},
          {"dtype", std::string(ir::dtype_name(q.dtype))},
          {"batch", q.sizes[0]},
          {"heads", q.sizes[1]},
          {"kv_heads", kv.sizes[1]},
          {"rows", q.sizes[2]},
          {"context", cache.sizes[2]},
          {"head_dim", q.sizes[3]},
          {"q", attention_operand(q)},
          {"k", attention_operand(kv)},
          {"v", attention_operand(k.inputs[2])},
          {"k_cache", attention_operand(cache)},
          {"v_cache", attention_operand(k.inputs[4])},
          {"o", attention_operand(k.output)},
          {"positions", positions.byte_offset},
          {"positions_i64", positions.dtype == ir::DType::I64}};
}

json train_json(const ir::Graph& g) {
  const ir::TrainConfig& t = g.config.train;
  const ir::OptimizerConfig& o = g.config.optimizer;
  json data = nullptr;
  if (t.has_data)
    data = {{"format", t.data.format},
            {"path", t.data.path},
            {"dtype", t.data.token_dtype},
            {"files", t.data.files},
            {"order", t.data.order},
            {"split", t.data.split}};
  return {{"steps", t.steps},
          {"seed", t.seed},
          {"accumulate", t.accumulate},
          {"data", data},
          {"eval_every", t.eval_every},
          {"eval_batches", t.eval_batches},
          {"checkpoint_every", t.checkpoint_every},
          {"checkpoint_dir", t.checkpoint_dir},
          {"checkpoint_keep", t.checkpoint_keep},
          {"log_every", t.log_every},
          {"metrics", t.metrics_path},
          {"optimizer", std::string(ir::optimizer_name(o.kind))},
          {"lr", o.lr},
          // The learning-rate schedule, fixed in the optimizer's kernels
          // (passes/optimizer.h): its length is train.steps at build time.
          {"schedule", {{"kind", o.schedule}, {"warmup", o.warmup_steps}, {"steps", t.steps}, {"min_lr", o.min_lr}}},
          {"precision", std::string(ir::precision_name(g.config.precision.policy))},
          {"dims", t.dims},
          {"memory_budget", t.memory_budget}};
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

json predicted_json(const analysis::StepTime& t) {
  if (!t.device) return nullptr;
  json classes = json::object();
  for (int c = 0; c < analysis::kNumKernelClasses; ++c)
    classes[std::string(analysis::kernel_class_name(static_cast<analysis::KernelClass>(c)))] = t.class_seconds[c];
  return {{"step_s", t.seconds},
          {"launch_s", t.launch_seconds},
          {"mfu", t.mfu},
          {"kernels_without_peak", t.kernels_without_peak},
          {"class_s", classes}};
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

std::string program_json(const ir::Graph& g, const KernelPlan& plan, const std::vector<Launch>& launches,
                         const ProgramFacts& facts) {
  const std::map<std::string, int64_t> bounds = index_bounds(g);
  json tensors = json::array();
  for (const PlannedTensor& t : plan.tensors) {
    json j = {{"name", t.name},
              {"role", std::string(tensor_role_name(t.role))},
              {"dtype", std::string(ir::dtype_name(t.dtype))},
              {"shape", t.shape},
              {"offset", t.byte_offset},
              {"bytes", t.bytes}};
    if (t.role == TensorRole::State) j["param"] = t.param;
    if (auto b = bounds.find(t.name); t.role == TensorRole::Input && b != bounds.end()) j["index_bound"] = b->second;
    if (t.role == TensorRole::Param)
      j["init"] = {{"kind", init_kind(t.init.kind)}, {"value", t.init.value}, {"std", t.init.std},
                   {"lo", t.init.lo}, {"hi", t.init.hi}};
    tensors.push_back(std::move(j));
  }
  // The time model's kernels are the plan's (analysis/step_kernels.h), one for one.
  const std::vector<analysis::KernelTime>& predicted = facts.predicted.kernels;
  NAPKIN_INTERNAL_CHECK(predicted.empty() || predicted.size() == plan.kernels.size(),
                        "the time model has {} kernels, the plan {}", predicted.size(), plan.kernels.size());
  json kernels = json::array();
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const Kernel& k = plan.kernels[i];
    json j = {{"name", k.name},
              {"where", k.where},
              {"phase", std::string(ir::phase_name(k.phase))},
              {"kind", runtime_kind(k.kind)},
              {"extent", launches.at(i).extent},
              {"parallel", launches.at(i).parallel},
              {"combine", launches.at(i).combine},
              {"out", operand_json(k.output)}};
    if (k.phase == ir::Phase::Optimizer) {
      // null: shared, every rank runs it; else the parameters' names.
      auto names = [&](const std::optional<std::vector<int>>& serves) -> json {
        if (!serves) return nullptr;
        json out = json::array();
        for (int p : *serves) out.push_back(g.value(g.params[static_cast<size_t>(p)].value).name);
        return out;
      };
      j["serves"] = names(k.serves);
      const std::vector<int64_t>& work = launches.at(i).member_work;
      if (!work.empty() && work.size() == k.member_serves.size()) {
        json members = json::array();
        for (size_t m = 0; m < work.size(); ++m) members.push_back({{"work", work[m]}, {"serves", names(k.member_serves[m])}});
        j["members"] = members;
      }
    }
    if (k.kind == KernelKind::Gemm) j["matmul"] = matmul_json(k);
    if (k.kind == KernelKind::Attention) j["attention"] = attention_json(k);
    if (k.kind == KernelKind::Classifier) j["classifier"] = classifier_json(k);
    if (k.kind == KernelKind::CachedAttention) j["cached_attention"] = cached_attention_json(k);
    if (!predicted.empty()) {
      const analysis::KernelTime& t = predicted[i];
      j["class"] = std::string(analysis::kernel_class_name(t.kind));
      j["flops"] = t.flops;
      j["bytes"] = t.bytes;
      j["predicted_s"] = t.no_peak ? json(nullptr) : json(t.seconds);
    }
    kernels.push_back(std::move(j));
  }
  json updates = json::array();
  json gradients = json::array();
  for (const PlannedGradient& grad : plan.gradients)
    gradients.push_back({{"param", grad.param},
                         {"dtype", std::string(ir::dtype_name(grad.dtype))},
                         {"offset", grad.byte_offset},
                         {"bytes", grad.bytes},
                         {"ready_after", grad.ready_after}});
  for (const UpdateCopy& u : plan.updates)
    updates.push_back({{"target", u.target}, {"from", u.from}, {"to", u.to}, {"bytes", u.bytes}, {"param", u.param}});
  json program = {{"format", "napkin-program-1"},
                  {"model", g.name},
                  {"hash", facts.model_hash},
                  {"backend", facts.backend},
                  {"arena_bytes", plan.arena_bytes},
                  {"liveness_peak", plan.liveness_peak},
                  {"flops_per_step", facts.flops_per_step},
                  {"flops_forward", facts.flops_forward},
                  {"flops_optimizer", facts.flops_optimizer},
                  {"tokens_per_step", facts.tokens_per_step},
                  {"device", facts.device},
                  {"peak_flops", facts.peak_flops},
                  {"peak_source", facts.peak_source},
                  {"device_file", facts.device_file},
                  {"predicted", predicted_json(facts.predicted)},
                  {"tensors", tensors},
                  {"kernels", kernels},
                  {"num_setup_kernels", plan.num_setup_kernels},
                  {"num_forward_kernels", plan.num_forward_kernels},
                  {"num_gradient_kernels", plan.num_gradient_kernels},
                  {"gradients", gradients},
                  {"bucket_bytes", analysis::kBucketBytes},
                  {"updates", updates},
                  {"train", train_json(g)}};
  return program.dump(1);
}

std::string training_settings_json(const ir::Graph& g) { return train_json(g).dump(); }

}  // namespace napkin::codegen
