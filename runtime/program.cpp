#include "runtime/program.h"

#include <nlohmann/json.hpp>

#include "runtime/error.h"

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
    if (t.role == TensorRole::Loss) return t;
  throw Error("the program has no loss tensor");
}

std::vector<const TensorSpec*> Program::with_role(TensorRole role) const {
  std::vector<const TensorSpec*> out;
  for (const TensorSpec& t : tensors)
    if (t.role == role) out.push_back(&t);
  return out;
}

std::vector<const TensorSpec*> step_metrics(const Program& program) {
  std::vector<const TensorSpec*> out;
  return program.with_role(TensorRole::Metric);
}

std::string bad_index_message(const Program& program, int64_t kernel, int64_t id, int64_t bound) {
  std::string what = "kernel " + std::to_string(kernel);
  bool expert = false;
  if (kernel >= 0 && kernel < static_cast<int64_t>(program.kernels.size())) {
    const KernelSpec& k = program.kernels[static_cast<size_t>(kernel)];
    what = k.name + (k.where.empty() ? "" : " at " + k.where);
    expert = k.as<MoeSlotsSpec>() != nullptr;
  }
  return what + ": id " + std::to_string(id) + " is outside [0, " + std::to_string(bound) +
         (expert ? "); an expert index comes from the router's top_k, so this is a bug in napkin: please report it"
                 : "); check the data's token ids against the model's vocab");
}


// The program's JSON, both ways: one to_json and one from_json per struct
// (nlohmann finds them by argument-dependent lookup). docs/runtime.md lists
// the fields. Optional fields are read with a default: a program written by
// hand (tests, tools) may leave them out.

using nlohmann::json;

void to_json(json& j, DType t) { j = std::string(dtype_name(t)); }
void from_json(const json& j, DType& t) { t = parse_dtype(j.get<std::string>()); }
constexpr std::string_view kInitNames[] = {"zeros", "ones", "constant", "normal", "trunc_normal"};  // InitKind's order
void to_json(json& j, InitKind k) { j = std::string(kInitNames[static_cast<size_t>(k)]); }
void from_json(const json& j, InitKind& k) { k = static_cast<InitKind>(name_index(kInitNames, j.get<std::string>(), "init")); }
void to_json(json& j, KernelPhase p) { j = std::string(phase_name(p)); }
void from_json(const json& j, KernelPhase& p) { p = parse_phase(j.get<std::string>()); }
void to_json(json& j, GemmActivation a) { j = std::string(activation_name(a)); }
void from_json(const json& j, GemmActivation& a) { a = parse_activation(j.get<std::string>()); }
void to_json(json& j, TensorRole r) { j = std::string(tensor_role_name(r)); }
void from_json(const json& j, TensorRole& r) { r = parse_tensor_role(j.get<std::string>()); }

// The structs whose keys are their fields' names. A descriptor's scalars
// share their kernel's object with the spec's operands.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ParamInit, kind, value, std, lo, hi)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MatmulDesc, batch, a_batch_stride, b_batch_stride, c_batch_stride, m, n, k,
                                   a_m_stride, a_k_stride, b_k_stride, b_n_stride, c_m_stride)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(GemmEpilogueSpec, d, d_dtype, residual, bias, activation, aux)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(AttentionDesc, causal, scale, batch, heads, kv_heads, q_len, kv_len, head_dim)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CachedAttentionDesc, scale, batch, heads, kv_heads, rows, context, head_dim,
                                   positions_i64)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ClassifierDesc, rows, vocab, d, x_row_stride, w_v_stride, w_d_stride, targets_i64)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ClassifierSpec::Cuda, chunk, chunks, logits, dx_acc)
constexpr std::string_view kRopeStyleNames[] = {"half", "interleaved"};  // RopeStyle's order
void to_json(json& j, RopeStyle s) { j = std::string(kRopeStyleNames[static_cast<size_t>(s)]); }
void from_json(const json& j, RopeStyle& s) {
  s = static_cast<RopeStyle>(name_index(kRopeStyleNames, j.get<std::string>(), "rope style"));
}
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RopeDesc, style, dim, theta, factor, low_freq_factor, high_freq_factor,
                                   original_context)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RopeKernelDesc, rope, inverse, sizes, x_strides, axis, seq_axis, explicit_positions,
                                   positions_i64)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TopKDesc, sizes, x_strides, k)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MoeSlotsDesc, tokens, k, experts, capacity, index_strides)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GradientSpec, param, dtype, offset, bytes, ready_after)
// The learning-rate schedule, fixed in the optimizer's kernels
// (passes/optimizer.h): its length is train.steps at build time; its lr is train.lr.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(LrSchedule, kind, warmup, steps, min_lr)
// null: the model names no data.
void to_json(json& j, const DataDefaults& d) {
  if (d.format.empty()) j = nullptr;
  else j = {{"format", d.format}, {"path", d.path}, {"dtype", d.dtype}, {"files", d.files}, {"order", d.order}, {"split", d.split}};
  if (!d.tokenizer.empty()) j["tokenizer"] = d.tokenizer;  // absent otherwise: programs of models without one stay as they were
}
void from_json(const json& j, DataDefaults& d) {
  if (!j.is_null())
    d = {j.at("format"), j.at("path"), j.at("dtype"), j.at("order"),
         j.at("files").get<std::map<std::string, std::string>>(), j.at("split"), j.value("tokenizer", std::string())};
}
// A program written by hand (tests, tools) may leave out any of these.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TrainDefaults, steps, seed, accumulate, data, eval_every, eval_batches,
                                                checkpoint_every, checkpoint_keep, checkpoint_dir, log_every, metrics,
                                                optimizer, precision, lr, schedule, dims, memory_budget)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CudaSpec, arch, scratch_bytes, tf32)

namespace {

// An attention kernel's rotary embeddings: the key "rope", absent when none.
void write_rope(json& j, const std::optional<RopeDesc>& r) {
  if (r) j["rope"] = *r;
}
void read_rope(const json& j, std::optional<RopeDesc>& r) {
  if (j.contains("rope")) r = j.at("rope").get<RopeDesc>();
}

// An attention kernel's operand as [offset, batch stride, head stride, row
// stride] (head_dim's stride is 1).
json operand(int64_t offset, const AttentionDesc::Strides& s) { return {offset, s.batch, s.head, s.row}; }
void read_operand(const json& j, const char* name, int64_t& offset, AttentionDesc::Strides& s) {
  const json& o = j.at(name);
  offset = o.at(0), s = {o.at(1).get<int64_t>(), o.at(2).get<int64_t>(), o.at(3).get<int64_t>()};
}

// "serves" of an optimizer kernel or batch member: null when shared.
json serves_json(bool shared, const std::vector<std::string>& serves) { return shared ? json(nullptr) : json(serves); }
void read_serves(const json& j, bool& shared, std::vector<std::string>& serves) {
  shared = j.is_null();
  if (!shared) serves = j.get<std::vector<std::string>>();
}

// Each payload writes itself into its kernel's object (a loop at the top
// level, every other kind under its own key) and reads itself back.
void write(json& kernel, const LoopSpec& s) {
  kernel.update({{"extent", s.extent}, {"parallel", s.parallel}, {"combine", s.combine}});
  for (const LoopSpec::Member& m : s.members)
    kernel["members"].push_back({{"work", m.work}, {"serves", serves_json(m.shared, m.serves)}});
}
void read(const json& kernel, const std::string&, LoopSpec& s) {
  s.extent = kernel.at("extent"), s.parallel = kernel.at("parallel"), s.combine = kernel.value("combine", false);
  for (const json& m : kernel.value("members", json::array())) {
    LoopSpec::Member& member = s.members.emplace_back(LoopSpec::Member{m.at("work")});
    read_serves(m.at("serves"), member.shared, member.serves);
  }
}

void write(json& kernel, const MatmulSpec& s) {
  if (s.epilogue) kernel["extent"] = s.epilogue->rows;
  json& m = kernel["matmul"] = s.desc;
  m.update({{"a", s.a}, {"b", s.b}, {"c", s.c}, {"a_dtype", s.a_dtype}, {"b_dtype", s.b_dtype}, {"c_dtype", s.c_dtype},
            {"epilogue", s.epilogue ? json(*s.epilogue) : json(nullptr)}, {"bias_grad", s.bias_grad}});
}
void read(const json& kernel, const std::string& name, MatmulSpec& s) {
  const json& m = kernel.at("matmul");
  s.desc = m;
  s.a = m.at("a"), s.b = m.at("b"), s.c = m.at("c");
  s.a_dtype = m.at("a_dtype"), s.b_dtype = m.at("b_dtype"), s.c_dtype = m.at("c_dtype");
  if (const json& e = m.value("epilogue", json()); !e.is_null()) {
    s.epilogue = e.get<GemmEpilogueSpec>();
    s.epilogue->rows = kernel.at("extent");
  }
  s.bias_grad = m.value("bias_grad", int64_t{-1});
  if (s.bias_grad >= 0 && (s.c_dtype != DType::F32 || !s.desc.batch.empty() || s.epilogue))
    throw Error("kernel " + name + ": a bias gradient needs one plain GEMM storing f32, without an epilogue");
}

void write(json& kernel, const AttentionSpec& s) {
  const AttentionDesc& d = s.desc;
  json& j = kernel["attention"] = d;
  j.update({{"backward", s.backward}, {"dtype", s.dtype}, {"lse", s.lse}, {"q", operand(s.q, d.q)},
            {"k", operand(s.k, d.k)}, {"v", operand(s.v, d.v)}, {"o", operand(s.o, d.o)}});
  write_rope(j, d.rope);
  if (s.backward)
    j.update({{"do", operand(s.d_o, d.d_o)}, {"dq", operand(s.dq, d.dq)}, {"dk", operand(s.dk, d.dk)},
              {"dv", operand(s.dv, d.dv)}});
}
void read(const json& kernel, const std::string&, AttentionSpec& s) {
  const json& j = kernel.at("attention");
  AttentionDesc& d = s.desc = j;
  s.backward = j.at("backward"), s.dtype = j.at("dtype"), s.lse = j.at("lse");
  read_operand(j, "q", s.q, d.q), read_operand(j, "k", s.k, d.k), read_operand(j, "v", s.v, d.v);
  read_operand(j, "o", s.o, d.o);
  read_rope(j, d.rope);
  if (s.backward)
    read_operand(j, "do", s.d_o, d.d_o), read_operand(j, "dq", s.dq, d.dq), read_operand(j, "dk", s.dk, d.dk),
        read_operand(j, "dv", s.dv, d.dv);
}

void write(json& kernel, const CachedAttentionSpec& s) {
  const CachedAttentionDesc& d = s.desc;
  json& j = kernel["cached_attention"] = d;
  j.update({{"dtype", s.dtype}, {"positions", s.positions}, {"q", operand(s.q, d.q)}, {"k", operand(s.k, d.k)},
            {"v", operand(s.v, d.v)}, {"k_cache", operand(s.k_cache, d.k_cache)},
            {"v_cache", operand(s.v_cache, d.v_cache)}, {"o", operand(s.o, d.o)}});
  write_rope(j, d.rope);
}
void read(const json& kernel, const std::string&, CachedAttentionSpec& s) {
  const json& j = kernel.at("cached_attention");
  CachedAttentionDesc& d = s.desc = j;
  s.dtype = j.at("dtype"), s.positions = j.at("positions");
  read_operand(j, "q", s.q, d.q), read_operand(j, "k", s.k, d.k), read_operand(j, "v", s.v, d.v);
  read_operand(j, "k_cache", s.k_cache, d.k_cache), read_operand(j, "v_cache", s.v_cache, d.v_cache);
  read_operand(j, "o", s.o, d.o);
  read_rope(j, d.rope);
}

void write(json& kernel, const RopeSpec& s) {
  json& j = kernel["rope"] = s.desc;
  j.update({{"dtype", s.dtype}, {"x", s.x}, {"y", s.y}, {"positions", s.positions}});
}
void read(const json& kernel, const std::string&, RopeSpec& s) {
  const json& j = kernel.at("rope");
  s.desc = j;
  s.dtype = j.at("dtype"), s.x = j.at("x"), s.y = j.at("y"), s.positions = j.at("positions");
}

void write(json& kernel, const TopKSpec& s) {
  json& j = kernel["top_k"] = s.desc;
  j.update({{"dtype", s.dtype}, {"x", s.x}, {"values", s.values}, {"indices", s.indices}});
}
void read(const json& kernel, const std::string&, TopKSpec& s) {
  const json& j = kernel.at("top_k");
  s.desc = j;
  s.dtype = j.at("dtype"), s.x = j.at("x"), s.values = j.at("values"), s.indices = j.at("indices");
}

void write(json& kernel, const MoeSlotsSpec& s) {
  json& j = kernel["moe_slots"] = s.desc;
  j.update({{"indices", s.indices}, {"pos", s.pos}, {"src", s.src}, {"counts", s.counts}});
}
void read(const json& kernel, const std::string&, MoeSlotsSpec& s) {
  const json& j = kernel.at("moe_slots");
  s.desc = j;
  s.indices = j.at("indices"), s.pos = j.at("pos"), s.src = j.at("src"), s.counts = j.at("counts");
}

void write(json& kernel, const CollectiveSpec& s) {
  kernel["collective"] = {{"collective", s.collective}, {"x", s.x}, {"y", s.y}, {"count", s.count}, {"dtype", s.dtype},
                          {"param", s.param}};
  if (s.wait >= 0) kernel["collective"]["wait"] = s.wait;
}
void read(const json& kernel, const std::string&, CollectiveSpec& s) {
  const json& j = kernel.at("collective");
  s.collective = j.at("collective"), s.x = j.at("x"), s.y = j.at("y"), s.count = j.at("count"), s.dtype = j.at("dtype"),
  s.param = j.at("param");
  s.wait = j.value("wait", int64_t{-1});
}

void write(json& kernel, const ClassifierSpec& s) {
  json& j = kernel["classifier"] = s.desc;
  j.update({{"backward", s.backward}, {"dtype", s.dtype}, {"x", s.x}, {"w", s.w}, {"targets", s.targets}, {"lse", s.lse}});
  if (s.backward) j.update({{"dloss", s.dloss}, {"dx", s.dx}, {"dw", s.dw}});
  else j["loss"] = s.loss;
  if (s.cuda) j["cuda"] = *s.cuda;
}
void read(const json& kernel, const std::string&, ClassifierSpec& s) {
  const json& j = kernel.at("classifier");
  s.desc = j;
  s.backward = j.at("backward"), s.dtype = j.at("dtype");
  s.x = j.at("x"), s.w = j.at("w"), s.targets = j.at("targets"), s.lse = j.at("lse");
  if (s.backward) s.dloss = j.at("dloss"), s.dx = j.at("dx"), s.dw = j.at("dw");
  else s.loss = j.at("loss");
  if (j.contains("cuda")) s.cuda = j.at("cuda").get<ClassifierSpec::Cuda>();
}

// The payload whose kind the kernel's "kind" names.
template <size_t I = 0>
KernelPayload read_payload(const json& kernel, const std::string& name) {
  if constexpr (I == std::variant_size_v<KernelPayload>) {
    throw Error("kernel " + name + ": unknown kind " + kernel.at("kind").dump());
  } else {
    using Spec = std::variant_alternative_t<I, KernelPayload>;
    if (kernel.at("kind") != Spec::kind) return read_payload<I + 1>(kernel, name);
    Spec spec;
    read(kernel, name, spec);
    return spec;
  }
}

}  // namespace

void to_json(json& j, const TensorSpec& t) {
  j = {{"name", t.name}, {"role", t.role}, {"dtype", t.dtype}, {"shape", t.shape}, {"offset", t.offset},
       {"bytes", t.bytes}};
  if (t.role == TensorRole::State) j["param"] = t.param;
  if (t.index_bound != 0) j["index_bound"] = t.index_bound;
  if (t.role == TensorRole::Param) j["init"] = t.init;
}
void from_json(const json& j, TensorSpec& t) {
  t.name = j.at("name"), t.role = j.at("role"), t.dtype = j.at("dtype");
  t.shape = j.at("shape").get<std::vector<int64_t>>();
  t.offset = j.at("offset"), t.bytes = j.at("bytes");
  t.param = j.value("param", ""), t.index_bound = j.value("index_bound", int64_t{0});
  if (const json& i = j.value("init", json()); !i.is_null()) t.init = i;
}

void to_json(json& j, const CudaLaunchSpec& l) {
  j = {{"function", l.function}, {"grid", l.grid}, {"block", l.block}, {"shared", l.shared_bytes}, {"offsets", l.offsets}};
}
void from_json(const json& j, CudaLaunchSpec& l) {
  l = {j.at("function"), j.at("grid"), j.at("block"), j.at("shared"), j.at("offsets").get<std::vector<int64_t>>()};
}

void to_json(json& j, const KernelSpec& k) {
  j = {{"name", k.name}, {"where", k.where}, {"phase", k.phase},
       {"out", {{"offset", k.out_offset}, {"dtype", k.out_dtype}, {"numel", k.out_numel}}}};
  // A launch of one item unless the payload says otherwise (a loop, a GEMM's epilogue).
  j.update({{"extent", 1}, {"parallel", false}, {"combine", false}});
  std::visit(
      [&](const auto& spec) {
        j["kind"] = spec.kind;
        write(j, spec);
      },
      k.payload);
  if (k.phase == KernelPhase::Optimizer) j["serves"] = serves_json(k.shared, k.serves);
  if (!k.kernel_class.empty()) {
    j["class"] = k.kernel_class;
    j["flops"] = k.flops;
    j["bytes"] = k.bytes;
    j["predicted_s"] = k.predicted_seconds < 0 ? json(nullptr) : json(k.predicted_seconds);
  }
  if (!k.cuda_launches.empty()) j["cuda_launches"] = k.cuda_launches;
}
void from_json(const json& j, KernelSpec& k) {
  k.name = j.at("name"), k.where = j.at("where"), k.phase = j.at("phase");
  k.payload = read_payload(j, k.name);
  const json& out = j.at("out");
  k.out_offset = out.at("offset"), k.out_numel = out.at("numel"), k.out_dtype = out.at("dtype");
  if (j.contains("class")) {
    k.kernel_class = j.at("class"), k.flops = j.at("flops"), k.bytes = j.at("bytes");
    k.predicted_seconds = j.at("predicted_s").is_null() ? -1.0 : j.at("predicted_s").get<double>();
  }
  read_serves(j.value("serves", json()), k.shared, k.serves);
  k.cuda_launches = j.value("cuda_launches", std::vector<CudaLaunchSpec>());
}

void to_json(json& j, const UpdateSpec& u) {
  j = {{"target", u.target}, {"from", u.from}, {"to", u.to}, {"bytes", u.bytes}, {"param", u.param}};
}
void from_json(const json& j, UpdateSpec& u) {
  u = {j.at("target"), j.at("from"), j.at("to"), j.at("bytes"), j.value("param", "")};
}

void to_json(json& j, const Program& p) {
  json predicted = nullptr;
  if (p.predicted.known)
    predicted = {{"step_s", p.predicted.step_seconds}, {"launch_s", p.predicted.launch_seconds},
                 {"mfu", p.predicted.mfu}, {"kernels_without_peak", p.predicted.kernels_without_peak},
                 {"class_s", p.predicted.class_seconds}};
  j = {{"format", "napkin-program-1"}, {"model", p.model}, {"hash", p.hash}, {"backend", p.backend},
       {"arena_bytes", p.arena_bytes}, {"liveness_peak", p.liveness_peak}, {"flops_per_step", p.flops_per_step},
       {"flops_forward", p.flops_forward}, {"flops_optimizer", p.flops_optimizer},
       {"tokens_per_step", p.tokens_per_step}, {"device", p.device}, {"peak_flops", p.peak_flops},
       {"peak_source", p.peak_source}, {"device_file", p.device_file}, {"predicted", predicted},
       {"tensors", p.tensors}, {"kernels", p.kernels}, {"num_setup_kernels", p.num_setup_kernels},
       {"num_forward_kernels", p.num_forward_kernels}, {"num_gradient_kernels", p.num_gradient_kernels},
       {"gradients", p.gradients}, {"bucket_bytes", p.bucket_bytes}, {"updates", p.updates}, {"train", p.train}};
  if (p.backend == "cuda") j["cuda"] = p.cuda;
}
void from_json(const json& j, Program& p) {
  if (j.at("format") != "napkin-program-1") throw Error("unknown program format " + j.at("format").dump());
  p.model = j.at("model"), p.hash = j.at("hash"), p.backend = j.at("backend"), p.device = j.at("device");
  p.arena_bytes = j.at("arena_bytes"), p.liveness_peak = j.at("liveness_peak");
  p.flops_per_step = j.at("flops_per_step"), p.flops_forward = j.at("flops_forward");
  p.flops_optimizer = j.at("flops_optimizer"), p.peak_flops = j.at("peak_flops");
  p.peak_source = j.value("peak_source", ""), p.device_file = j.value("device_file", "");
  if (const json& t = j.value("predicted", json()); !t.is_null())
    p.predicted = {true, t.at("step_s"), t.at("launch_s"), t.at("mfu"), t.at("kernels_without_peak"),
                   t.value("class_s", std::map<std::string, double>())};
  p.tokens_per_step = j.at("tokens_per_step");
  p.tensors = j.at("tensors").get<std::vector<TensorSpec>>();
  p.kernels = j.at("kernels").get<std::vector<KernelSpec>>();
  p.num_setup_kernels = j.value("num_setup_kernels", 0);
  p.num_forward_kernels = j.at("num_forward_kernels"), p.num_gradient_kernels = j.at("num_gradient_kernels");
  p.gradients = j.at("gradients").get<std::vector<GradientSpec>>();
  p.bucket_bytes = j.at("bucket_bytes");
  if (const json& c = j.value("cuda", json()); !c.is_null()) p.cuda = c;
  p.updates = j.at("updates").get<std::vector<UpdateSpec>>();
  p.train = j.at("train");
  p.train.schedule.lr = p.train.lr;
}

std::string program_json(const Program& program) { return json(program).dump(1); }

std::string train_defaults_json(const TrainDefaults& train) { return json(train).dump(); }

Program parse_program(const char* text, size_t size) {
  try {
    return json::parse(text, text + size).get<Program>();
  } catch (const json::exception& e) {
    throw Error(std::string("the trainer's program description is corrupt: ") + e.what());
  }
}

}  // namespace napkin::runtime
