// runtime/program.cpp writes a program as JSON and reads it back in one
// place: a program with every field set to a value other than its default,
// and one kernel of every payload kind (forward and backward where the kind
// has both), must come back equal. A field the writer or the reader drops
// comes back as its default and fails here.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <variant>

#include "runtime/error.h"
#include "runtime/program.h"

namespace {

using namespace napkin::runtime;

AttentionDesc::Strides strides(int64_t base) { return {base, base + 1, base + 2}; }

KernelSpec kernel(const std::string& name, KernelPayload payload) {
  KernelSpec k;
  k.name = name, k.where = name + ".yaml:3:7", k.phase = KernelPhase::Backward;
  k.payload = std::move(payload);
  k.out_offset = 96, k.out_numel = 12, k.out_dtype = DType::BF16;
  k.kernel_class = "matmul", k.flops = 1e9, k.bytes = 2e6, k.predicted_seconds = 3e-5;
  return k;
}

// Every kind the runtime runs, each with every field of its payload set.
std::vector<KernelSpec> every_kind() {
  LoopSpec loop{.extent = 7, .parallel = true, .combine = true, .members = {{3, {"w1"}, false}, {4, {}, true}}};
  KernelSpec optimizer = kernel("adam", loop);
  optimizer.phase = KernelPhase::Optimizer, optimizer.serves = {"w1", "w2"}, optimizer.shared = false;
  optimizer.predicted_seconds = -1;  // no peak for its dtype

  MatmulSpec gemm{.a = 8, .b = 16, .c = 24, .a_dtype = DType::BF16, .b_dtype = DType::BF16, .c_dtype = DType::F32};
  gemm.desc = {{2}, {40}, {0}, {50}, 5, 6, 7, 8, 1, 9, 1, 10};
  MatmulSpec epilogue = gemm;
  epilogue.epilogue = GemmEpilogueSpec{.d = 32, .residual = 40, .bias = 48, .d_dtype = DType::F16,
                                       .activation = GemmActivation::Gelu, .aux = 56, .rows = 64};
  MatmulSpec bias_grad = gemm;
  bias_grad.desc.batch.clear(), bias_grad.desc.a_batch_stride.clear(), bias_grad.desc.b_batch_stride.clear(),
      bias_grad.desc.c_batch_stride.clear();
  bias_grad.bias_grad = 72;

  AttentionSpec attention{.backward = false, .dtype = DType::BF16, .q = 1, .k = 2, .v = 3, .o = 4, .lse = 5};
  attention.desc = {2, 4, 2, 8, 16, 32, false, 0.125, strides(10), strides(20), strides(30), strides(40)};
  AttentionSpec attention_grad = attention;
  attention_grad.backward = true;
  attention_grad.d_o = 6, attention_grad.dq = 7, attention_grad.dk = 8, attention_grad.dv = 9;
  attention_grad.desc.d_o = strides(50), attention_grad.desc.dq = strides(60), attention_grad.desc.dk = strides(70),
  attention_grad.desc.dv = strides(80);
  attention_grad.desc.rope = RopeDesc{RopeStyle::Interleaved, 32, 500000, 8, 1, 4, 8192};  // the forward has none

  CachedAttentionSpec cached{.dtype = DType::F16, .q = 1, .k = 2, .v = 3, .k_cache = 4, .v_cache = 5, .o = 6,
                             .positions = 7};
  cached.desc = {2, 4, 2, 1, 64, 16, 0.25, true, strides(1), strides(2), strides(3), strides(4), strides(5), strides(6)};
  cached.desc.rope = RopeDesc{RopeStyle::Half, 16, 10000, 0, 1, 4, 8192};

  ClassifierSpec classifier{.backward = false, .dtype = DType::F32, .x = 1, .w = 2, .targets = 3, .loss = 4, .lse = 5};
  classifier.desc = {6, 50, 8, 9, 10, 11, true};
  classifier.cuda = ClassifierSpec::Cuda{512, 3, 128, 256};
  ClassifierSpec classifier_grad = classifier;
  classifier_grad.backward = true, classifier_grad.loss = 0;
  classifier_grad.dloss = 6, classifier_grad.dx = 7, classifier_grad.dw = 8;
  classifier_grad.cuda.reset();  // a CPU program's

  RopeSpec rope{.dtype = DType::BF16, .x = 1, .y = 2, .positions = 3};
  rope.desc.rope = {RopeStyle::Interleaved, 8, 500000, 8, 1, 4, 8192};
  rope.desc.inverse = true, rope.desc.sizes = {2, 4, 3, 8}, rope.desc.x_strides = {96, 8, 32, 1};
  rope.desc.axis = 3, rope.desc.seq_axis = 1, rope.desc.explicit_positions = true, rope.desc.positions_i64 = true;

  TopKSpec top_k{.dtype = DType::BF16, .x = 16, .values = 32, .indices = 48};
  top_k.desc.sizes = {4, 3, 8}, top_k.desc.x_strides = {1, 32, 4}, top_k.desc.k = 2;
  const MoeSlotsSpec moe_slots{.desc = {.tokens = 12, .k = 2, .experts = 8, .capacity = 5, .index_strides = {1, 12}},
                               .indices = 8, .pos = 104, .src = 200, .counts = 360};

  KernelSpec launched = kernel("attention_cuda", attention);
  launched.cuda_launches = {{"napkin_attention_fwd", 12, 128, 4096, {1, 2, 3}}, {"napkin_lse", 1, 32, 0, {5}}};
  return {optimizer,
          kernel("gemm", gemm),
          kernel("gemm_epilogue", epilogue),
          kernel("gemm_bias_grad", bias_grad),
          kernel("attention", attention),
          kernel("attention_grad", attention_grad),
          launched,
          kernel("cached_attention", cached),
          kernel("classifier", classifier),
          kernel("classifier_grad", classifier_grad),
          kernel("rope", rope),
          kernel("top_k", top_k),
          kernel("moe_slots", moe_slots),
          kernel("collective", CollectiveSpec{.collective = "reduce_scatter", .x = 256, .y = 512, .count = 64, .dtype = DType::BF16, .param = "w"}),
          kernel("prefetched", CollectiveSpec{.collective = "all_gather", .x = 0, .y = 1024, .count = 16, .dtype = DType::F32, .param = "w", .wait = 9})};
}

Program full_program() {
  Program p;
  p.model = "tiny", p.hash = "abc123", p.backend = "cuda", p.device = "h100";
  p.arena_bytes = 4096, p.liveness_peak = 2048;
  p.flops_per_step = 1e9, p.flops_forward = 3e8, p.flops_optimizer = 1e6, p.peak_flops = 9.9e14;
  p.peak_source = "datasheet", p.device_file = "devices.yaml";
  p.predicted = {true, 0.5, 0.01, 0.4, 2, {{"matmul", 0.3}, {"elementwise", 0.2}}};
  p.tokens_per_step = 512;
  TensorSpec w{.name = "w1", .role = TensorRole::Param, .dtype = DType::BF16, .shape = {4, 8}, .offset = 64,
               .bytes = 64};
  w.init = {InitKind::TruncNormal, 0.5, 0.02, -0.04, 0.04};
  TensorSpec m{.name = "adam.m.w1", .role = TensorRole::State, .dtype = DType::F32, .shape = {4, 8}, .offset = 128,
               .bytes = 128, .param = "w1"};
  TensorSpec tokens{.name = "tokens", .role = TensorRole::Input, .dtype = DType::I32, .shape = {2, 8}, .offset = 256,
                    .bytes = 64, .index_bound = 50};
  TensorSpec loss{.name = "loss", .role = TensorRole::Loss, .dtype = DType::F32, .shape = {}, .offset = 320, .bytes = 4};
  p.tensors = {w, m, tokens, loss};
  p.kernels = every_kind();
  p.num_setup_kernels = 1, p.num_forward_kernels = 3, p.num_gradient_kernels = 8;
  p.gradients = {{"w1", DType::F32, 512, 128, 4}};
  p.bucket_bytes = 1024;
  p.updates = {{"w1", 640, 64, 64, "w1"}};
  TrainDefaults& t = p.train;
  t.steps = 100, t.seed = 7, t.accumulate = 2;
  t.data = {"tokens", "data/tiny.bin", "i32", "sequential", {{"tokens", "a.npy"}}, 0.8};
  t.eval_every = 10, t.eval_batches = 3, t.checkpoint_every = 20, t.checkpoint_keep = 4;
  t.checkpoint_dir = "ckpt", t.log_every = 5, t.metrics = "m.jsonl", t.optimizer = "adamw", t.precision = "bf16-mixed";
  t.lr = 3e-4;
  t.schedule = {"cosine", 10, 100, 3e-4, 3e-5};
  t.dims = "layers=2", t.memory_budget = 1 << 30;
  p.cuda = {"sm_90", 8192, true};
  return p;
}

Program round_trip(const Program& p) {
  const std::string text = program_json(p);
  return parse_program(text.data(), text.size());
}

}  // namespace

TEST_CASE("program json: a program with every field and every kernel kind comes back equal") {
  const Program p = full_program();
  // Every alternative of the payload variant is in the program (a new kind must be added here).
  std::vector<bool> kinds(std::variant_size_v<KernelPayload>, false);
  for (const KernelSpec& k : p.kernels) kinds[k.payload.index()] = true;
  CHECK(std::count(kinds.begin(), kinds.end(), false) == 0);
  const Program back = round_trip(p);
  REQUIRE(back.kernels.size() == p.kernels.size());
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    CAPTURE(p.kernels[i].name);
    CHECK(back.kernels[i] == p.kernels[i]);
  }
  CHECK(back.tensors == p.tensors);
  CHECK(back.train == p.train);
  CHECK(back == p);
  CHECK(program_json(back) == program_json(p));
}

TEST_CASE("program json: optional parts left out come back as their defaults") {
  Program p = full_program();
  p.backend = "cpu", p.cuda = {};
  p.predicted = {};
  p.train.data = {};
  p.kernels = {kernel("loop", LoopSpec{})};
  CHECK(round_trip(p) == p);
}

TEST_CASE("program json: a corrupt program is an error naming what is wrong") {
  std::string text = program_json(full_program());
  CHECK_THROWS_WITH_AS(parse_program(text.data(), text.size() / 2),
                       doctest::Contains("the trainer's program description is corrupt"), Error);
  const std::string kind = "\"kind\": \"cached_attention\"";
  std::string unknown_kind = text;
  unknown_kind.replace(unknown_kind.find(kind), kind.size(), "\"kind\": \"paged_attention\"");
  CHECK_THROWS_WITH_AS(parse_program(unknown_kind.data(), unknown_kind.size()),
                       "kernel cached_attention: unknown kind \"paged_attention\"", Error);
}
