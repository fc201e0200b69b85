#include "runtime/program.h"

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/tensor_element.h"

namespace napkin::runtime {

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t GradientSpec::numel() const { return bytes / element_bytes(dtype); }

const TensorSpec* Program::find(const std::string& name) const {
  for (const TensorSpec& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const TensorSpec& Program::loss() const {
  for (const TensorSpec& t : tensors)
    if (t.role == "loss") return t;
  throw Error("the program has no loss tensor");
}

std::vector<const TensorSpec*> Program::with_role(const std::string& role) const {
  std::vector<const TensorSpec*> out;
  for (const TensorSpec& t : tensors)
    if (t.role == role) out.push_back(&t);
  return out;
}

std::string bad_index_message(const Program& program, int64_t kernel, int64_t id, int64_t bound) {
  std::string what = "kernel " + std::to_string(kernel);
  if (kernel >= 0 && kernel < static_cast<int64_t>(program.kernels.size())) {
    const KernelSpec& k = program.kernels[static_cast<size_t>(kernel)];
    what = k.name + (k.where.empty() ? "" : " at " + k.where);
  }
  return what + ": id " + std::to_string(id) + " is outside [0, " + std::to_string(bound) +
         "); check the data's token ids against the model's vocab";
}

namespace {

// Attention operand `name` of a kernel's object as the program writes it:
// [offset, batch stride, head stride, row stride] (codegen/program_json.cpp;
// head_dim's stride is 1).
void attention_operand(const nlohmann::json& kernel, const char* name, int64_t& offset,
                       AttentionDesc::Strides& strides) {
  const nlohmann::json& o = kernel.at(name);
  offset = o.at(0);
  strides = {o.at(1).get<int64_t>(), o.at(2).get<int64_t>(), o.at(3).get<int64_t>()};
}

}  // namespace

Program parse_program(const char* text, size_t size) {
  using nlohmann::json;
  try {
    json j = json::parse(text, text + size);
    if (j.at("format") != "napkin-program-1") throw Error("unknown program format " + j.at("format").dump());
    Program p;
    p.model = j.at("model");
    p.hash = j.at("hash");
    p.backend = j.at("backend");
    p.device = j.at("device");
    p.arena_bytes = j.at("arena_bytes");
    p.liveness_peak = j.at("liveness_peak");
    p.flops_per_step = j.at("flops_per_step");
    p.flops_forward = j.at("flops_forward");
    p.flops_optimizer = j.at("flops_optimizer");
    p.peak_flops = j.at("peak_flops");
    // Optional: a program written by hand (tests, tools) may leave out the time model.
    p.peak_source = j.value("peak_source", "");
    p.device_file = j.value("device_file", "");
    if (const json& t = j.value("predicted", json()); !t.is_null()) {
      p.predicted.known = true;
      p.predicted.step_seconds = t.at("step_s");
      p.predicted.launch_seconds = t.at("launch_s");
      p.predicted.mfu = t.at("mfu");
      p.predicted.kernels_without_peak = t.at("kernels_without_peak");
    }
    p.tokens_per_step = j.at("tokens_per_step");
    for (const json& t : j.at("tensors")) {
      TensorSpec s;
      s.name = t.at("name");
      s.role = t.at("role");
      s.dtype = t.at("dtype");
      s.shape = t.at("shape").get<std::vector<int64_t>>();
      s.offset = t.at("offset");
      s.bytes = t.at("bytes");
      s.param = t.value("param", "");
      s.index_bound = t.value("index_bound", int64_t{0});
      if (t.contains("init")) {
        const json& i = t.at("init");
        s.init = {i.at("kind"), i.at("value"), i.at("std"), i.at("lo"), i.at("hi")};
      }
      p.tensors.push_back(std::move(s));
    }
    for (const json& k : j.at("kernels")) {
      KernelSpec s;
      s.name = k.at("name");
      s.where = k.at("where");
      s.phase = k.at("phase");
      s.is_matmul = k.at("kind") == "matmul";
      s.is_attention = k.at("kind") == "attention";
      s.is_classifier = k.at("kind") == "classifier";
      s.is_cached_attention = k.at("kind") == "cached_attention";
      s.extent = k.at("extent");
      s.parallel = k.at("parallel");
      s.combine = k.value("combine", false);
      s.out_offset = k.at("out").at("offset");
      s.out_numel = k.at("out").at("numel");
      s.out_dtype = k.at("out").at("dtype");
      if (k.contains("class")) {
        s.kernel_class = k.at("class");
        s.flops = k.at("flops");
        s.bytes = k.at("bytes");
        s.predicted_seconds = k.at("predicted_s").is_null() ? -1.0 : k.at("predicted_s").get<double>();
      }
      if (s.is_matmul) {
        const json& m = k.at("matmul");
        s.matmul.a = m.at("a");
        s.matmul.b = m.at("b");
        s.matmul.c = m.at("c");
        s.matmul.a_dtype = m.at("a_dtype");
        s.matmul.b_dtype = m.at("b_dtype");
        s.matmul.c_dtype = m.at("c_dtype");
        MatmulDesc& d = s.matmul.desc;
        d.batch = m.at("batch").get<std::vector<int64_t>>();
        d.a_batch_stride = m.at("a_batch_stride").get<std::vector<int64_t>>();
        d.b_batch_stride = m.at("b_batch_stride").get<std::vector<int64_t>>();
        d.c_batch_stride = m.at("c_batch_stride").get<std::vector<int64_t>>();
        d.m = m.at("m");
        d.n = m.at("n");
        d.k = m.at("k");
        d.a_m_stride = m.at("a_m_stride");
        d.a_k_stride = m.at("a_k_stride");
        d.b_k_stride = m.at("b_k_stride");
        d.b_n_stride = m.at("b_n_stride");
        d.c_m_stride = m.at("c_m_stride");
        if (m.contains("epilogue") && !m.at("epilogue").is_null()) {
          const json& e = m.at("epilogue");
          GemmEpilogueSpec& ep = s.matmul.epilogue;
          ep.on = true;
          ep.d = e.at("d");
          ep.d_dtype = e.at("d_dtype");
          ep.residual = e.at("residual");
          ep.bias = e.at("bias");
          ep.activation = e.value("activation", std::string("none"));
          ep.aux = e.value("aux", int64_t{-1});
          if (ep.activation != "none" && ep.activation != "gelu" && ep.activation != "gelu_grad")
            throw Error("kernel " + s.name + ": unknown GEMM epilogue activation '" + ep.activation + "'");
        }
        s.matmul.bias_grad = m.value("bias_grad", int64_t{-1});
        if (s.matmul.bias_grad >= 0 && (s.matmul.c_dtype != "f32" || !d.batch.empty() || s.matmul.epilogue.on))
          throw Error("kernel " + s.name + ": a bias gradient needs one plain GEMM storing f32, without an epilogue");
      }
      if (s.is_classifier) {
        const json& c = k.at("classifier");
        ClassifierSpec& t = s.classifier;
        t.backward = c.at("backward");
        t.dtype = c.at("dtype");
        t.desc.rows = c.at("rows");
        t.desc.vocab = c.at("vocab");
        t.desc.d = c.at("d");
        t.desc.x_row_stride = c.at("x_row_stride");
        t.desc.w_v_stride = c.at("w_v_stride");
        t.desc.w_d_stride = c.at("w_d_stride");
        t.desc.targets_i64 = c.at("targets_i64");
        t.x = c.at("x");
        t.w = c.at("w");
        t.targets = c.at("targets");
        t.lse = c.at("lse");
        if (t.backward) {
          t.dloss = c.at("dloss");
          t.dx = c.at("dx");
          t.dw = c.at("dw");
        } else {
          t.loss = c.at("loss");
        }
        if (c.contains("cuda")) {
          const json& g = c.at("cuda");
          t.cuda = {g.at("chunk"), g.at("chunks"), g.at("logits"), g.at("dx_acc")};
        }
      }
      if (s.is_cached_attention) {
        const json& a = k.at("cached_attention");
        CachedAttentionSpec& t = s.cached_attention;
        CachedAttentionDesc& d = t.desc;
        t.dtype = a.at("dtype");
        d.scale = a.at("scale");
        d.batch = a.at("batch");
        d.heads = a.at("heads");
        d.kv_heads = a.at("kv_heads");
        d.rows = a.at("rows");
        d.context = a.at("context");
        d.head_dim = a.at("head_dim");
        d.positions_i64 = a.at("positions_i64");
        attention_operand(a, "q", t.q, d.q);
        attention_operand(a, "k", t.k, d.k);
        attention_operand(a, "v", t.v, d.v);
        attention_operand(a, "k_cache", t.k_cache, d.k_cache);
        attention_operand(a, "v_cache", t.v_cache, d.v_cache);
        attention_operand(a, "o", t.o, d.o);
        t.positions = a.at("positions");
      }
      if (s.is_attention) {
        const json& a = k.at("attention");
        AttentionSpec& t = s.attention;
        t.backward = a.at("backward");
        t.dtype = a.at("dtype");
        AttentionDesc& d = t.desc;
        d.causal = a.at("causal");
        d.scale = a.at("scale");
        d.batch = a.at("batch");
        d.heads = a.at("heads");
        d.kv_heads = a.at("kv_heads");
        d.q_len = a.at("q_len");
        d.kv_len = a.at("kv_len");
        d.head_dim = a.at("head_dim");
        attention_operand(a, "q", t.q, d.q);
        attention_operand(a, "k", t.k, d.k);
        attention_operand(a, "v", t.v, d.v);
        attention_operand(a, "o", t.o, d.o);
        t.lse = a.at("lse");
        if (t.backward) {
          attention_operand(a, "do", t.d_o, d.d_o);
          attention_operand(a, "dq", t.dq, d.dq);
          attention_operand(a, "dk", t.dk, d.dk);
          attention_operand(a, "dv", t.dv, d.dv);
        }
      }
      if (const json& serves = k.value("serves", json()); !serves.is_null()) {
        s.serves = serves.get<std::vector<std::string>>();
        s.shared = false;
      }
      if (k.contains("members"))
        for (const json& m : k.at("members")) {
          KernelSpec::Member member;
          member.work = m.at("work");
          if (!m.at("serves").is_null()) {
            member.serves = m.at("serves").get<std::vector<std::string>>();
            member.shared = false;
          }
          s.members.push_back(std::move(member));
        }
      if (k.contains("cuda_launches"))
        for (const json& l : k.at("cuda_launches"))
          s.cuda_launches.push_back({l.at("function"), l.at("grid"), l.at("block"), l.at("shared"),
                                    l.at("offsets").get<std::vector<int64_t>>()});
      p.kernels.push_back(std::move(s));
    }
    p.num_setup_kernels = j.value("num_setup_kernels", 0);
    p.num_forward_kernels = j.at("num_forward_kernels");
    p.num_gradient_kernels = j.at("num_gradient_kernels");
    for (const json& grad : j.at("gradients"))
      p.gradients.push_back({grad.at("param"), grad.at("dtype"), grad.at("offset"), grad.at("bytes"), grad.at("ready_after")});
    p.bucket_bytes = j.at("bucket_bytes");
    if (j.contains("cuda")) {
      const json& c = j.at("cuda");
      p.cuda = {c.at("arch"), c.at("scratch_bytes"), c.at("tf32")};
    }
    for (const json& u : j.at("updates"))
      p.updates.push_back({u.at("target"), u.at("from"), u.at("to"), u.at("bytes"), u.value("param", "")});
    const json& t = j.at("train");
    TrainDefaults& d = p.train;
    d.steps = t.at("steps");
    d.seed = t.at("seed");
    d.accumulate = t.at("accumulate");
    if (!t.at("data").is_null()) {
      const json& data = t.at("data");
      d.data.format = data.at("format");
      d.data.path = data.at("path");
      d.data.dtype = data.at("dtype");
      d.data.files = data.at("files").get<std::map<std::string, std::string>>();
      d.data.order = data.at("order");
      d.data.split = data.at("split");
    }
    d.eval_every = t.at("eval_every");
    d.eval_batches = t.at("eval_batches");
    d.checkpoint_every = t.at("checkpoint_every");
    d.checkpoint_dir = t.at("checkpoint_dir");
    d.checkpoint_keep = t.at("checkpoint_keep");
    d.log_every = t.at("log_every");
    d.metrics = t.at("metrics");
    d.optimizer = t.at("optimizer");
    d.precision = t.at("precision");
    d.dims = t.value("dims", std::string());
    d.memory_budget = t.value("memory_budget", int64_t{0});
    d.lr = t.at("lr");
    d.schedule.lr = d.lr;
    if (const json& sch = t.value("schedule", json()); !sch.is_null()) {
      d.schedule.kind = sch.at("kind");
      d.schedule.warmup = sch.at("warmup");
      d.schedule.steps = sch.at("steps");
      d.schedule.min_lr = sch.at("min_lr");
    }
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("the trainer's program description is corrupt: ") + e.what());
  }
}

}  // namespace napkin::runtime
