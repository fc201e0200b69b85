// CUDA trainers end to end on a fake GPU (tests/fake_cuda/fake_cuda.h): the
// CUDA engine (runtime/cuda) runs for real — driver calls, cuBLASLt calls,
// CUDA graphs, pinned buffers, the bad-index flag, the PTX fallback —
// against a library that keeps device memory in host memory and runs the
// generated kernels on the host CUDA emulator. Each model is trained for a
// few steps as a CUDA trainer and as a CPU trainer on the same data and
// seed, and the per-step losses (--metrics) must agree: fp32 within 1e-4
// relative, bf16-mixed within 2e-2 (the matmuls round differently: cuBLASLt's
// sum in the fake is in double, the CPU's in f32). Runs that must give the
// same bits: graphs vs no graphs, work run at once vs as late as a GPU may
// run it (NAPKIN_FAKE_CUDA_DEFER=1), --profile and --debug-nan (each kernel
// alone), a resumed run vs an uninterrupted one, PTX JIT vs cubin.
#if defined(NAPKIN_HAVE_CUDA_RUNTIME) && defined(NAPKIN_HAVE_CUDA)

#include <dlfcn.h>
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_driver.h"
#include "runtime/cuda/device_arena.h"
#include "runtime/npy.h"
#include "runtime/optimizer_shards.h"
#include "runtime/program.h"
#include "runtime/safetensors.h"
#include "support/checkpoint_content.h"
#include "support/data_parallel_jobs.h"
#include "support/test_io.h"
#include "support/test_models.h"

namespace fs = std::filesystem;
using napkin::testing::read_bytes;
using napkin::testing::TempDir;
using napkin::testing::write_bytes;
using Run = napkin::testing::CommandResult;

namespace {

Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

// Where tests/fake_cuda builds the fake and its two names: beside tools/ in
// the build directory that NAPKIN_BINARY (build/tools/napkin) is in.
const std::string kFakeCudaDir = (fs::path(NAPKIN_BINARY).parent_path().parent_path() / "tests/fake_cuda").string();

struct Trainers {
  std::string cuda, cuda_source, cpu;
};

// `model` (relative to the source tree, or absolute) as a CUDA trainer with
// its CUDA C source, and as a CPU trainer, in `dir`.
Trainers build_both(const std::string& model, const std::string& dims, const TempDir& dir,
                    const std::string& cuda_flags = "") {
  Trainers t{dir / "cuda", dir / "cuda.cu", dir / "cpu"};
  Run cuda = sh(fmt::format("NAPKIN_CACHE_DIR={} {} build {} --dims {} --target cuda -o {} --emit-cuda {} --quiet {}",
                            dir / "nvrtc-cache", NAPKIN_BINARY, model, dims, t.cuda, t.cuda_source, cuda_flags));
  INFO(cuda.out);
  REQUIRE(cuda.status == 0);
  Run cpu = sh(fmt::format("{} build {} --dims {} -o {} --quiet", NAPKIN_BINARY, model, dims, t.cpu));
  INFO(cpu.out);
  REQUIRE(cpu.status == 0);
  return t;
}

// The GEMM epilogues of a CUDA trainer's program (runtime/program.h GemmEpilogueSpec).
struct EpilogueCount {
  int bias = 0, residual = 0, narrow = 0;
  int bias_grad = 0;  // weight gradients' GEMMs storing their bias gradients (BGRADA)
};
EpilogueCount epilogues_of(const Trainers& t) {
  Run program = sh(t.cuda + " --print-program");
  INFO(program.out);
  REQUIRE(program.status == 0);
  EpilogueCount n;
  const nlohmann::json parsed = nlohmann::json::parse(program.out);
  for (const auto& k : parsed.at("kernels")) {
    if (k.contains("matmul")) n.bias_grad += k.at("matmul").value("bias_grad", int64_t{-1}) >= 0;
    if (!k.contains("matmul") || k.at("matmul").at("epilogue").is_null()) continue;
    const auto& e = k.at("matmul").at("epilogue");
    n.bias += e.at("bias").get<int64_t>() >= 0;
    n.residual += e.at("residual").get<int64_t>() >= 0;
    n.narrow += e.at("d_dtype") != "f32";
  }
  return n;
}

// The CUDA trainer on the fake GPU; `env`: more VAR=value assignments.
Run run_cuda(const Trainers& t, const std::string& flags, const std::string& env = "") {
  return sh(fmt::format("{} NAPKIN_FAKE_CUDA_SOURCE={} LD_LIBRARY_PATH={} {} {}", env, t.cuda_source,
                        kFakeCudaDir, t.cuda, flags));
}

// Every value of `key` in a --metrics file, in its order.
std::vector<double> metric_values(const std::string& metrics, const char* key) {
  std::vector<double> out;
  std::istringstream lines(read_bytes(metrics));
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains(key)) out.push_back(j[key].get<double>());
  }
  return out;
}

// The per-step training losses of a --metrics file.
std::vector<double> losses(const std::string& metrics) { return metric_values(metrics, "loss"); }

// The eval losses of a --metrics file.
std::vector<double> eval_losses(const std::string& metrics) { return metric_values(metrics, "eval_loss"); }

// Trains with `flags` and metrics into dir/NAME.jsonl; its losses.
std::vector<double> train(const std::string& trainer_run, const TempDir& dir, const std::string& name) {
  std::string metrics = dir / (name + ".jsonl");
  fs::remove(metrics);
  Run r = sh(fmt::format("{} --metrics {} --checkpoint-dir {}", trainer_run, metrics, dir / ("ckpt-" + name)));
  INFO(name << ": " << r.out);
  REQUIRE(r.status == 0);
  return losses(metrics);
}

std::vector<double> train_cuda(const Trainers& t, const std::string& flags, const TempDir& dir, const std::string& name,
                               const std::string& env = "") {
  std::string metrics = dir / (name + ".jsonl");
  fs::remove(metrics);
  Run r = run_cuda(t, fmt::format("{} --metrics {} --checkpoint-dir {}", flags, metrics, dir / ("ckpt-" + name)), env);
  INFO(name << ": " << r.out);
  REQUIRE(r.status == 0);
  return losses(metrics);
}

void check_close(const std::vector<double>& cpu, const std::vector<double>& cuda, double relative) {
  REQUIRE(cpu.size() == cuda.size());
  REQUIRE(!cpu.empty());
  double worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    CAPTURE(i);
    CAPTURE(cpu[i]);
    CAPTURE(cuda[i]);
    REQUIRE(std::isfinite(cuda[i]));
    worst = std::max(worst, std::abs(cpu[i] - cuda[i]) / std::abs(cpu[i]));
    CHECK(std::abs(cpu[i] - cuda[i]) <= relative * std::abs(cpu[i]));
  }
  MESSAGE(fmt::format("losses over {} steps agree within {:.3g} relative (tolerance {:.0e})", cpu.size(), worst,
                      relative));
}

// An f32 .npy file of `rows` x `cols` values in [-1, 1) from a fixed LCG.
void write_npy(const std::string& path, int64_t rows, int64_t cols, uint64_t seed) {
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::string bytes = "\x93NUMPY\x01";
  bytes += '\0';
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header;
  for (int64_t i = 0; i < rows * cols; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    float v = static_cast<float>(static_cast<double>(seed >> 11) / 9007199254740992.0 * 2 - 1);
    bytes.append(reinterpret_cast<const char*>(&v), 4);
  }
  write_bytes(path, bytes);
}

// The gpt model (byte tokens, vocab 256) at small dims, on the e2e tests' tokens.
const char* kGptDims = "d=64,layers=2,batch=4,seq=32";
const char* kGptData = "--data tests/e2e/data/gpt/tokens.u16";
const char* kCommon = "--order sequential --seed 0 --eval-every 0 --log-every 1";

// models/gpt.yaml with `precision:` replaced, in dir.
std::string gpt_at(const std::string& precision, const TempDir& dir) {
  std::string text = read_bytes(std::string(NAPKIN_SOURCE_DIR) + "/models/gpt.yaml");
  size_t at = text.find("\nprecision:");
  REQUIRE(at != std::string::npos);
  text.replace(at + 1, text.find('\n', at + 1) - at - 1, "precision: " + precision);
  std::string path = dir / ("gpt-" + precision + ".yaml");
  write_bytes(path, text);
  return path;
}

}  // namespace

TEST_CASE("fake cuda: one library under both names with every entry point the CUDA runtime resolves") {
  const std::string& dir = kFakeCudaDir;
  void* cuda = dlopen((dir + "/libcuda.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);
  void* lt = dlopen((dir + "/libcublasLt.so.13").c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(cuda != nullptr);
  REQUIRE(lt != nullptr);
  CHECK(cuda == lt);  // one file, mapped once: the two names share one fake GPU
#define NAPKIN_TEST_STRINGIFY_EXPANDED(x) #x
#define NAPKIN_TEST_STRINGIFY(x) NAPKIN_TEST_STRINGIFY_EXPANDED(x)
#define NAPKIN_TEST_RESOLVES(name) CHECK_MESSAGE(dlsym(lt, NAPKIN_TEST_STRINGIFY(name)) != nullptr, #name);
  NAPKIN_CUBLASLT_ENTRY_POINTS(NAPKIN_TEST_RESOLVES)
#undef NAPKIN_TEST_RESOLVES

  // The runtime's own loader resolves every driver entry point (it throws
  // naming the missing ones); then the capture rules, on the fake itself.
  using napkin::runtime::cuda::CudaDriver;
  CudaDriver d((dir + "/libcuda.so.1").c_str());
  REQUIRE(d.cuInit(0) == CUDA_SUCCESS);
  CUcontext context = nullptr;
  CUdevice device = 0;
  REQUIRE(d.cuDeviceGet(&device, 0) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CHECK(d.cuMemAlloc(&p, 1000) == CUDA_ERROR_INVALID_CONTEXT);  // no current context yet
  REQUIRE(d.cuDevicePrimaryCtxRetain(&context, device) == CUDA_SUCCESS);
  REQUIRE(d.cuCtxSetCurrent(context) == CUDA_SUCCESS);
  CUstream stream = nullptr;
  REQUIRE(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(d.cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
  CHECK(p % 256 == 0);
  auto* bytes = reinterpret_cast<unsigned char*>(p);
  CHECK(bytes[0] == 0xff);  // fresh device memory is NaN bytes
  CHECK(bytes[999] == 0xff);
  CHECK(d.error_text(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) ==
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (operation not permitted when stream is capturing)");

  // A synchronizing call during capture fails and invalidates the capture.
  REQUIRE(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(d.cuMemsetD8Async(p, 0, 1000, stream) == CUDA_SUCCESS);
  CHECK(bytes[0] == 0xff);  // recorded, not run
  CHECK(d.cuStreamSynchronize(stream) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph = nullptr;
  CHECK(d.cuStreamEndCapture(stream, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(graph == nullptr);

  // A clean capture replays on every launch, after its graph is destroyed.
  REQUIRE(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(d.cuMemsetD8Async(p + 10, 7, 20, stream) == CUDA_SUCCESS);
  CHECK(d.cuMemsetD8Async(p + 990, 7, 20, stream) == CUDA_ERROR_INVALID_VALUE);  // past the allocation
  REQUIRE(d.cuStreamEndCapture(stream, &graph) == CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  REQUIRE(d.cuGraphInstantiate(&exec, graph, 0) == CUDA_SUCCESS);
  REQUIRE(d.cuGraphDestroy(graph) == CUDA_SUCCESS);
  CHECK(bytes[10] == 0xff);
  REQUIRE(d.cuGraphLaunch(exec, stream) == CUDA_SUCCESS);
  REQUIRE(d.cuStreamSynchronize(stream) == CUDA_SUCCESS);
  CHECK(bytes[9] == 0xff);
  CHECK(bytes[10] == 7);
  CHECK(bytes[29] == 7);
  CHECK(bytes[30] == 0xff);
  CHECK(d.cuGraphExecDestroy(exec) == CUDA_SUCCESS);
  CHECK(d.cuMemFree(p) == CUDA_SUCCESS);
  CHECK(d.cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);
  CHECK(d.cuStreamDestroy(stream) == CUDA_SUCCESS);
  CHECK(d.cuDevicePrimaryCtxRelease(device) == CUDA_SUCCESS);
  dlclose(lt);
  dlclose(cuda);
}

TEST_CASE("fake cuda: linear and mlp train on the fake GPU as on the CPU and graphs or deferred work change no bit") {
  struct Case {
    const char* model;
    const char* dims;
    std::string data;
  };
  TempDir data("fakecuda-data");
  write_npy(data / "x.npy", 256, 256, 1);
  write_npy(data / "y.npy", 256, 64, 2);
  for (const Case& c : {Case{"models/linear.yaml", "batch=64", fmt::format("--data-file x={} --data-file y={}",
                                                                           data / "x.npy", data / "y.npy")},
                        Case{"models/mlp.yaml", "batch=16,d_in=64,hidden=32",
                             "--data-file images=tests/e2e/data/mlp/images.npy "
                             "--data-file labels=tests/e2e/data/mlp/labels.npy"}}) {
    CAPTURE(c.model);
    TempDir dir("fakecuda");
    Trainers t = build_both(c.model, c.dims, dir);
    std::string flags = fmt::format("{} {} --steps 5 --quiet", kCommon, c.data);
    std::vector<double> cpu = train(t.cpu + " " + flags, dir, "cpu");
    std::vector<double> cuda = train_cuda(t, flags, dir, "cuda");
    check_close(cpu, cuda, 1e-4);
    CHECK(train_cuda(t, flags, dir, "no-graphs", "NAPKIN_CUDA_GRAPHS=0") == cuda);
    CHECK(train_cuda(t, flags, dir, "deferred", "NAPKIN_FAKE_CUDA_DEFER=1") == cuda);
    CHECK(napkin::testing::checkpoint_content(dir / "ckpt-cuda/step-000005.safetensors") ==
          napkin::testing::checkpoint_content(dir / "ckpt-deferred/step-000005.safetensors"));
  }
}

TEST_CASE("fake cuda: --debug-nan on the GPU names the kernel the CPU names") {
  TempDir dir("fakecuda-nan");
  Trainers t = build_both("models/mlp.yaml", "batch=16,d_in=64,hidden=32", dir);
  napkin::runtime::SafetensorsFile init(std::string(NAPKIN_SOURCE_DIR) + "/tests/e2e/data/mlp/init.safetensors");
  std::vector<napkin::runtime::TensorData> tensors;
  std::vector<float> w1;
  for (const auto& x : init.tensors()) {
    if (x.name == "w1") {
      const float* p = reinterpret_cast<const float*>(x.data);
      w1.assign(p, p + 64 * 32);
      w1[5] = std::numeric_limits<float>::quiet_NaN();
      tensors.push_back({x.name, x.dtype, x.shape, w1.data()});
    } else {
      tensors.push_back({x.name, x.dtype, x.shape, x.data});
    }
  }
  napkin::runtime::write_safetensors_file(dir / "nan.safetensors", tensors, {});
  std::string flags = fmt::format(
      "--data-file images=tests/e2e/data/mlp/images.npy --data-file labels=tests/e2e/data/mlp/labels.npy --quiet "
      "--steps 2 --init {} --debug-nan --checkpoint-dir {}",
      dir / "nan.safetensors", dir / "ckpt");
  Run cpu = sh(t.cpu + " " + flags);
  Run cuda = run_cuda(t, flags);
  INFO(cpu.out);
  INFO(cuda.out);
  CHECK(cpu.status == 1);
  CHECK(cuda.status == 1);
  auto first_nan = [](const std::string& out) {
    size_t at = out.find("produced the first NaN");
    REQUIRE(at != std::string::npos);
    size_t begin = out.rfind('\n', at);
    return out.substr(begin == std::string::npos ? 0 : begin + 1, out.find('\n', at) - begin);
  };
  CHECK(first_nan(cuda.out) == first_nan(cpu.out));
}

TEST_CASE("fake cuda: gpt fp32 trains on the fake GPU as on the CPU with graphs or --profile or --debug-nan and resumed") {
  TempDir dir("fakecuda-gpt");
  Trainers t = build_both("models/gpt.yaml", kGptDims, dir);
  std::string flags = fmt::format("{} {} --steps 4 --quiet", kCommon, kGptData);
  std::vector<double> cpu = train(t.cpu + " " + flags, dir, "cpu");
  std::vector<double> cuda = train_cuda(t, flags, dir, "cuda");
  check_close(cpu, cuda, 1e-4);
  CHECK(train_cuda(t, flags, dir, "no-graphs", "NAPKIN_CUDA_GRAPHS=0") == cuda);
  CHECK(train_cuda(t, flags + " --profile", dir, "profile") == cuda);
  CHECK(train_cuda(t, flags + " --debug-nan", dir, "debug-nan") == cuda);

  // Two steps, a checkpoint, then resumed to four: the same losses and bytes.
  std::string split = dir / "ckpt-split";
  Run first = run_cuda(t, fmt::format("{} {} --steps 2 --quiet --checkpoint-dir {} --checkpoint-every 2", kCommon,
                                      kGptData, split));
  INFO(first.out);
  REQUIRE(first.status == 0);
  Run second = run_cuda(t, fmt::format("{} {} --steps 4 --quiet --resume {} --checkpoint-dir {} --metrics {}", kCommon,
                                       kGptData, split, split, dir / "resumed.jsonl"));
  INFO(second.out);
  REQUIRE(second.status == 0);
  CHECK(losses(dir / "resumed.jsonl") == std::vector<double>(cuda.begin() + 2, cuda.end()));
  std::string whole = napkin::testing::checkpoint_content(dir / "ckpt-cuda/step-000004.safetensors");
  CHECK(whole.size() > 100000);
  CHECK(napkin::testing::checkpoint_content(split + "/step-000004.safetensors") == whole);
}

TEST_CASE("fake cuda: gpt bf16-mixed trains on the fake GPU as on the CPU and an id out of range stops it as on the CPU") {
  TempDir dir("fakecuda-gpt-bf16");
  Trainers t = build_both(gpt_at("bf16-mixed", dir), kGptDims, dir);
  std::string flags = fmt::format("{} {} --steps 4 --quiet", kCommon, kGptData);
  std::vector<double> cpu = train(t.cpu + " " + flags, dir, "cpu");
  std::vector<double> cuda = train_cuda(t, flags, dir, "cuda");
  check_close(cpu, cuda, 2e-2);
  CHECK(train_cuda(t, flags, dir, "no-graphs", "NAPKIN_CUDA_GRAPHS=0") == cuda);

  // Those losses came through cuBLASLt's epilogues: each block's two residual projections read x as C.
  CHECK(epilogues_of(t).residual >= 2 * 2);  // kGptDims: 2 layers

  // Id 300 in a byte-level model, a few batches in (met by a kernel
  // replayed from a CUDA graph): the CUDA trainer stops where the CPU one
  // does, with the CPU's message. From .npy files: a token file's ids never
  // reach a kernel, the data loader checks them (trainer_guarantees_test).
  const std::string tokens = read_bytes(std::string(NAPKIN_SOURCE_DIR) + "/tests/e2e/data/gpt/tokens.u16");
  std::vector<int32_t> x(16 * 32), y(16 * 32);  // 16 rows of seq 32: windows of the token file
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<unsigned char>(tokens[2 * i]) | static_cast<unsigned char>(tokens[2 * i + 1]) << 8;
    y[i] = static_cast<unsigned char>(tokens[2 * i + 2]) | static_cast<unsigned char>(tokens[2 * i + 3]) << 8;
  }
  x[8 * 32 + 5] = 300;  // row 8: step 3 of sequential batches of 4
  napkin::runtime::write_npy(dir / "x.npy", "<i4", {16, 32}, x.data(), x.size() * 4);
  napkin::runtime::write_npy(dir / "y.npy", "<i4", {16, 32}, y.data(), y.size() * 4);
  std::string bad_flags = fmt::format("{} --data-file tokens={} --data-file targets={} --steps 4 --quiet "
                                      "--checkpoint-dir {}",
                                      kCommon, dir / "x.npy", dir / "y.npy", dir / "ckpt-bad");
  Run bad_cpu = sh(fmt::format("{} {} --metrics {}", t.cpu, bad_flags, dir / "bad-cpu.jsonl"));
  Run bad = run_cuda(t, fmt::format("{} --metrics {}", bad_flags, dir / "bad-cuda.jsonl"));
  INFO(bad_cpu.out);
  INFO(bad.out);
  CHECK(bad_cpu.status == 1);
  CHECK(bad.status == 1);
  CHECK(bad.out.find("id 300 is outside [0, 256)") != std::string::npos);
  CHECK(bad.out == bad_cpu.out);
  std::vector<double> before = losses(dir / "bad-cuda.jsonl");
  CHECK(before.size() >= 2);  // past the eager first step, into the graphs
  CHECK(before.size() == losses(dir / "bad-cpu.jsonl").size());
}

TEST_CASE("fake cuda: GPT-2 (biases everywhere, bf16-mixed) trains on the fake GPU as on the CPU through cuBLASLt's bias epilogues") {
  TempDir dir("fakecuda-gpt2");
  Trainers t = build_both("models/gpt2-124m.yaml", "vocab=256,d=64,heads=4,layers=2,batch=4,seq=32", dir);
  // Per block: qkv = bf16(x W + b) (bias, narrowed), x + y W + b and x + m W + b (residual and bias).
  const EpilogueCount e = epilogues_of(t);
  CHECK(e.bias >= 3 * 2);
  CHECK(e.residual >= 2 * 2);
  CHECK(e.narrow >= 2);
  // Per block, the qkv and fc weight gradients' GEMMs store their biases' gradients (cuBLASLt's BGRADA).
  CHECK(e.bias_grad == 2 * 2);
  std::string flags = fmt::format("{} {} --steps 4 --quiet", kCommon, kGptData);
  std::vector<double> cpu = train(t.cpu + " " + flags, dir, "cpu");
  std::vector<double> cuda = train_cuda(t, flags, dir, "cuda");
  check_close(cpu, cuda, 2e-2);
  // Where cuBLASLt has no BGRADA algorithm, a second GEMM (ones x B) sums the same B into the same vector.
  Run fallback = run_cuda(t, fmt::format("{} --metrics {} --checkpoint-dir {}", flags, dir / "fallback.jsonl",
                                         dir / "ckpt-fallback"),
                          "NAPKIN_FAKE_CUBLASLT_NO_BGRAD=1");
  INFO(fallback.out);
  REQUIRE(fallback.status == 0);
  CHECK(fallback.out.find("no bias-gradient epilogue (BGRADA)") != std::string::npos);
  check_close(cuda, losses(dir / "fallback.jsonl"), 1e-5);
}

TEST_CASE("fake cuda: lm-gqa (untied [d, vocab] head, grouped heads, SwiGLU, RMSNorm) trains on the fake GPU as on the CPU") {
  // Its head is stored [d, vocab]: the fused classifier's GEMMs read w
  // transposed (runtime/cuda/cuda_classifier.h), dx's f32 sums in scratch.
  TempDir dir("fakecuda-lm-gqa");
  Trainers t = build_both("models/lm-gqa.yaml", "batch=2,seq=16,vocab=256,d=32,heads=4,kv_heads=2,hidden=48,layers=2", dir);
  std::string flags = fmt::format("{} {} --steps 4 --quiet", kCommon, kGptData);
  std::vector<double> cpu = train(t.cpu + " " + flags, dir, "cpu");
  std::vector<double> cuda = train_cuda(t, flags, dir, "cuda");
  check_close(cpu, cuda, 2e-2);
  CHECK(train_cuda(t, flags, dir, "no-graphs", "NAPKIN_CUDA_GRAPHS=0") == cuda);
}

// models/moe.yaml on the fake GPU: top_k and moe_slots kernels
// (codegen/cuda/routing.cpp), the experts as cuBLASLt batched GEMMs over the
// experts axis, dispatch and combine as embedding gathers and scatter-adds,
// and the step's dropped-pair metric read back from the device. Capacity
// factor 1 drops pairs, so the slots' order matters: the losses follow the
// CPU's and so do the dropped counts.
TEST_CASE("fake cuda: models/moe.yaml (top-2 of 4 experts, capacity factor 1) trains on the fake GPU as on the CPU, dropping the same pairs") {
  TempDir dir("fakecuda-moe");
  Trainers t = build_both("models/moe.yaml",
                          "batch=2,seq=16,vocab=256,d=32,heads=4,kv_heads=2,experts=4,top_k=2,expert_hidden=48,"
                          "capacity_percent=100,layers=2",
                          dir);
  std::string flags = fmt::format("{} {} --steps 4 --quiet", kCommon, kGptData);
  std::vector<double> cpu = train(t.cpu + " " + flags, dir, "cpu");
  std::vector<double> cuda = train_cuda(t, flags, dir, "cuda");
  check_close(cpu, cuda, 1e-4);
  std::vector<double> dropped[2];
  for (int side = 0; side < 2; ++side) {
    std::ifstream in(dir / (side == 0 ? "cpu.jsonl" : "cuda.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("moe_dropped")) dropped[side].push_back(j["moe_dropped"]["layers.0"].get<double>() +
                                                              j["moe_dropped"]["layers.1"].get<double>());
    }
  }
  CHECK(dropped[0].size() == 4);
  CHECK(dropped[0] == dropped[1]);
}

// rope's own kernels (codegen/cuda/rope.cpp), compiled by NVRTC and run on
// the fake GPU: tests/models/llama-rope-op.yaml with explicit positions, so
// q's and k's rotations (and their inverses in the backward) stay kernels of
// their own rather than moving into attention.
TEST_CASE("fake cuda: a Llama whose q and k are turned by standalone rope kernels trains on the fake GPU as on the CPU") {
  TempDir dir("fakecuda-rope");
  std::string text = read_bytes(std::string(NAPKIN_SOURCE_DIR) + "/tests/models/llama-rope-op.yaml");
  for (const char* t : {"q", "k"}) {
    const std::string from = fmt::format("rope({}, theta=10000)", t);
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), fmt::format("rope({}, theta=10000, positions=arange(seq))", t));
  }
  const std::string model = dir / "llama-rope-positions.yaml";
  write_bytes(model, text);
  Trainers t = build_both(model, "batch=2,seq=16,d=32,layers=2", dir);
  int rope_kernels = 0;
  Run program = sh(t.cuda + " --print-program");
  REQUIRE(program.status == 0);
  const nlohmann::json parsed = nlohmann::json::parse(program.out);
  for (const auto& k : parsed.at("kernels")) rope_kernels += k.at("kind") == "rope";
  CHECK(rope_kernels == 8);  // q and k, forward and backward, in 2 layers
  std::string flags = fmt::format("{} {} --steps 4 --quiet", kCommon, kGptData);
  std::vector<double> cpu = train(t.cpu + " " + flags, dir, "cpu");
  std::vector<double> cuda = train_cuda(t, flags, dir, "cuda");
  check_close(cpu, cuda, 1e-4);
}

// tests/models/llama-rope-op.yaml as written: its ropes of q and k move into
// the attention (passes/fuse_rope), whose CUDA kernels rotate the q and k
// tiles as they load them and dq, dk back, NVRTC-compiled and run on the fake GPU.
TEST_CASE("fake cuda: a Llama whose rope is fused into attention trains on the fake GPU as on the CPU") {
  TempDir dir("fakecuda-rope-fused");
  Trainers t = build_both(std::string(NAPKIN_SOURCE_DIR) + "/tests/models/llama-rope-op.yaml", "batch=2,seq=16,d=32,layers=2",
                          dir);
  Run program = sh(t.cuda + " --print-program");
  REQUIRE(program.status == 0);
  int rope_kernels = 0, attention_kernels = 0;
  const nlohmann::json parsed = nlohmann::json::parse(program.out);
  for (const auto& k : parsed.at("kernels")) {
    rope_kernels += k.at("kind") == "rope";
    attention_kernels += k.at("kind") == "attention";
  }
  CHECK(rope_kernels == 0);
  CHECK(attention_kernels == 4);  // forward and backward, in 2 layers
  std::string flags = fmt::format("{} {} --steps 4 --quiet", kCommon, kGptData);
  std::vector<double> cpu = train(t.cpu + " " + flags, dir, "cpu");
  std::vector<double> cuda = train_cuda(t, flags, dir, "cuda");
  check_close(cpu, cuda, 1e-4);
}

TEST_CASE("fake cuda: the module loads from the cubin on its architecture or else from the PTX") {
  TempDir data("fakecuda-data");
  write_npy(data / "x.npy", 256, 256, 1);
  write_npy(data / "y.npy", 256, 64, 2);
  std::string flags = fmt::format("{} --data-file x={} --data-file y={} --steps 3", kCommon, data / "x.npy",
                                  data / "y.npy");
  TempDir sm90("fakecuda-sm90"), sm80("fakecuda-sm80");
  Trainers t90 = build_both("models/linear.yaml", "batch=64", sm90);
  Trainers t80 = build_both("models/linear.yaml", "batch=64", sm80, "--arch sm_80");
  auto banner = [&](const Trainers& t, const TempDir& dir, const std::string& name, const std::string& env) {
    std::string metrics = dir / (name + ".jsonl");
    Run r = run_cuda(t, fmt::format("{} --metrics {} --checkpoint-dir {}", flags, metrics, dir / name), env);
    INFO(r.out);
    REQUIRE(r.status == 0);
    return std::make_pair(r.out.substr(0, r.out.find('\n')), losses(metrics));
  };
  auto [cubin, cubin_losses] = banner(t90, sm90, "sm90-on-sm90", "");
  CHECK(cubin == "napkin trainer: linear (cuda, NVIDIA Fake GPU, sm_90, cubin)");
  // An sm_80 cubin does not run on sm_90; its PTX compiles for it.
  auto [jit, jit_losses] = banner(t80, sm80, "sm80-on-sm90", "");
  CHECK(jit == "napkin trainer: linear (cuda, NVIDIA Fake GPU, sm_90, PTX JIT from sm_80)");
  CHECK(jit_losses == cubin_losses);
  auto [a100, a100_losses] = banner(t80, sm80, "sm80-on-sm80", "NAPKIN_FAKE_CUDA_ARCH=sm_80");
  CHECK(a100 == "napkin trainer: linear (cuda, NVIDIA Fake GPU, sm_80, cubin)");
  CHECK(a100_losses == cubin_losses);
  // An sm_90 trainer has nothing an sm_80 GPU can run.
  Run old = run_cuda(t90, flags + " --checkpoint-dir " + (sm90 / "old"), "NAPKIN_FAKE_CUDA_ARCH=sm_80");
  INFO(old.out);
  CHECK(old.status == 1);
  CHECK(old.out.find("sm_90 cubin does not run on this GPU (CUDA_ERROR_NO_BINARY_FOR_GPU") != std::string::npos);
  CHECK(old.out.find("JIT-compiling its PTX failed") != std::string::npos);
  CHECK(old.out.find("CUDA_ERROR_INVALID_PTX") != std::string::npos);
  CHECK(old.out.find("ptxas fatal") != std::string::npos);  // the JIT's log, through CU_JIT_ERROR_LOG_BUFFER
}

TEST_CASE("fake cuda: an mlp with dropout trains and evaluates on the fake GPU as on the CPU") {
  // The CUDA engine uploads the rng tensor before every forward: without the
  // training words the GPU's dropout would be the identity and its losses
  // would leave the CPU's at the first step; without the eval words its eval
  // losses would leave them.
  TempDir dir("fakecuda-dropout");
  std::string text = napkin::testing::read_source("models/mlp.yaml");
  const std::string from = "- h1: gelu(images @ w1 + b1)";
  REQUIRE(text.find(from) != std::string::npos);
  text.replace(text.find(from), from.size(), "- h1: dropout(gelu(images @ w1 + b1), 0.5)");
  write_bytes(dir / "mlp.yaml", text);
  Trainers t = build_both(dir / "mlp.yaml", "batch=16,d_in=64,hidden=32", dir);
  std::string flags = fmt::format(
      "--order sequential --seed 3 --log-every 1 --steps 4 --eval-every 2 --quiet "
      "--data-file images=tests/e2e/data/mlp/images.npy --data-file labels=tests/e2e/data/mlp/labels.npy");
  std::vector<double> cpu = train(t.cpu + " " + flags, dir, "cpu");
  std::vector<double> cuda = train_cuda(t, flags, dir, "cuda");
  check_close(cpu, cuda, 1e-4);
  std::vector<double> cpu_eval = eval_losses(dir / "cpu.jsonl"), cuda_eval = eval_losses(dir / "cuda.jsonl");
  CHECK(cpu_eval.size() == 2);
  check_close(cpu_eval, cuda_eval, 1e-4);
}

// Data parallel on fake GPUs (docs/distributed.md): 2 ranks under mpirun,
// each on its own fake GPU, average their gradients through NCCL's calls
// (the fake's NCCL moves the bytes with MPI), and train as one GPU with the
// whole batch; with NAPKIN_NCCL=0 the gradients go through the host and MPI;
// one GPU accumulating two micro-batches trains so too (through the host).
// SGD, whose update scales with the gradient (AdamW's would hide a wrong
// divisor).
TEST_CASE("fake cuda: 2 ranks average gradients through NCCL (or the host) and train as one GPU with the whole batch") {
  REQUIRE(sh("command -v mpirun").status == 0);
  TempDir dir("fakecuda-dp");
  std::string yaml = napkin::testing::read_source("models/gpt.yaml");
  const size_t line = yaml.find("\noptimizer: ");
  REQUIRE(line != std::string::npos);
  yaml.replace(line + 1, yaml.find('\n', line + 1) - line - 1, "optimizer: sgd(lr=0.5, momentum=0.9)");
  write_bytes(dir / "gpt.yaml", yaml);
  TempDir whole_dir("fakecuda-dp-b4");
  const Trainers whole = build_both(dir / "gpt.yaml", "batch=4,seq=32,d=32,heads=2,layers=1", whole_dir);
  const Trainers micro = build_both(dir / "gpt.yaml", "batch=2,seq=32,d=32,heads=2,layers=1", dir);
  const std::string flags = fmt::format("{} {} --steps 4", kCommon, kGptData);
  const std::string mpirun = napkin::testing::data_parallel::mpirun(2);
  std::vector<double> one = train_cuda(whole, flags + " --quiet", dir, "one");
  REQUIRE(one.size() == 4);

  Run nccl = sh(fmt::format("NAPKIN_FAKE_CUDA_SOURCE={} LD_LIBRARY_PATH={} {} {} {} --metrics {} --checkpoint-every 0 "
                            "--checkpoint-dir {}",
                            micro.cuda_source, kFakeCudaDir, mpirun, micro.cuda, flags, dir / "nccl.jsonl",
                            dir / "nccl-ckpt"));
  INFO(nccl.out);
  REQUIRE(nccl.status == 0);
  CHECK(nccl.out.find("gradients all-reduced by NCCL 2.28.0 on the GPU") != std::string::npos);
  check_close(one, losses(dir / "nccl.jsonl"), 1e-5);

  Run host = sh(fmt::format(
      "NAPKIN_NCCL=0 NAPKIN_FAKE_CUDA_SOURCE={} LD_LIBRARY_PATH={} {} {} {} --metrics {} --checkpoint-every 0",
      micro.cuda_source, kFakeCudaDir, mpirun, micro.cuda, flags, dir / "host.jsonl"));
  INFO(host.out);
  REQUIRE(host.status == 0);
  CHECK(host.out.find("no device collectives: NAPKIN_NCCL=0") != std::string::npos);
  CHECK(losses(dir / "host.jsonl") == losses(dir / "nccl.jsonl"));  // the same sums: f32, two ranks, then halved

  // Small buckets: the backward in segments, each bucket all-reduced on a second stream while the next segment
  // runs. The same bits with the work run as late as a GPU may run it (a missing wait for the gradients would
  // all-reduce stale ones), without graphs, and as one bucket after the backward.
  for (const std::string env : {"", "NAPKIN_FAKE_CUDA_DEFER=1", "NAPKIN_CUDA_GRAPHS=0", "NAPKIN_CUDA_OVERLAP=0"}) {
    CAPTURE(env);
    const std::string metrics = dir / fmt::format("buckets{}.jsonl", env.size());
    Run r = sh(fmt::format("{} NAPKIN_FAKE_CUDA_SOURCE={} LD_LIBRARY_PATH={} {} {} {} --metrics {} --checkpoint-every 0 "
                           "--bucket-mib 0.01",
                           env, micro.cuda_source, kFakeCudaDir, mpirun, micro.cuda, flags, metrics));
    INFO(r.out);
    REQUIRE(r.status == 0);
    const bool overlap = env != "NAPKIN_CUDA_OVERLAP=0";
    CHECK(r.out.find(overlap ? "in 4 buckets, each as soon as the backward has written it" : "after the backward") !=
          std::string::npos);
    CHECK(losses(metrics) == losses(dir / "nccl.jsonl"));
  }

  // ZeRO-1: each rank's GPU runs its own share of the optimizer; the same bits. Each rank saves its share of
  // the last step (a sharded checkpoint), which consolidates into the plain run's checkpoint.
  Run zero = sh(fmt::format("NAPKIN_FAKE_CUDA_SOURCE={} LD_LIBRARY_PATH={} {} {} {} --metrics {} --checkpoint-every 0 "
                            "--zero 1 --checkpoint-dir {}",
                            micro.cuda_source, kFakeCudaDir, mpirun, micro.cuda, flags, dir / "zero.jsonl",
                            dir / "zero-ckpt"));
  INFO(zero.out);
  REQUIRE(zero.status == 0);
  CHECK(zero.out.find("ZeRO-1     rank 0 updates") != std::string::npos);
  CHECK(losses(dir / "zero.jsonl") == losses(dir / "nccl.jsonl"));
  Run consolidated = sh(fmt::format("{} checkpoint consolidate {} -o {}", NAPKIN_BINARY, dir / "zero-ckpt/step-000004.sharded",
                                    dir / "zero.safetensors"));
  INFO(consolidated.out);
  REQUIRE(consolidated.status == 0);
  CHECK(napkin::testing::checkpoint_content(dir / "zero.safetensors") ==
        napkin::testing::checkpoint_content(dir / "nccl-ckpt/step-000004.safetensors"));

  check_close(one, train_cuda(micro, flags + " --quiet --accumulate 2", dir, "accumulated"), 1e-5);
}


namespace {

// NAPKIN_FAKE_NCCL_REPORT's file of one rank: calls per collective (tests/fake_cuda/fake_nccl.cpp).
nlohmann::json nccl_report(const std::string& prefix, int rank) {
  return nlohmann::json::parse(read_bytes(fmt::format("{}.{}.json", prefix, rank)));
}

// gpt.yaml (its AdamW clips the global norm) with no checkpoint line and `precision`, in `dir`.
std::string gpt_without_checkpoints(const TempDir& dir, const std::string& precision = "fp32") {
  std::string yaml = napkin::testing::read_source("models/gpt.yaml");
  const size_t at = yaml.find("  checkpoint: {");
  REQUIRE(at != std::string::npos);
  yaml.erase(at, yaml.find('\n', at) + 1 - at);
  const size_t line = yaml.find("\nprecision: ");
  REQUIRE(line != std::string::npos);
  yaml.replace(line + 1, yaml.find('\n', line + 1) - line - 1, "precision: " + precision);
  write_bytes(dir / "gpt.yaml", yaml);
  return dir / "gpt.yaml";
}

// fp16-mixed's loss scale (passes/loss_scaling.h) in a single-file checkpoint.
float loss_scale(const std::string& checkpoint) {
  napkin::runtime::SafetensorsFile f(checkpoint);
  for (const auto& t : f.tensors())
    if (t.name == "loss_scale.scale") {
      REQUIRE(t.dtype == "f32");
      float v = 0;
      std::memcpy(&v, t.data, sizeof v);
      return v;
    }
  FAIL("no loss_scale.scale in " << checkpoint);
  return 0;
}

}  // namespace

TEST_CASE("fake cuda: --zero 2 on 2 fake GPUs reduces each gradient onto its owner through NCCL and sums the clipping norm's parts there, as plain data parallel trains (issue 40)") {
  // gpt.yaml's AdamW clips the global norm. One micro-batch: the backward's buckets are averaged onto each
  // gradient's owner by ncclReduce on the GPU (the others' copies zeroed) and the norm's parts summed by the
  // optimizer's all_reduce_sum kernel (ncclAllReduce); two: the gradient stage reduce-scatters them by MPI
  // through the host, the norm's parts still summed on the GPU.
  REQUIRE(sh("command -v mpirun").status == 0);
  TempDir dir("fakecuda-zero2");
  const Trainers micro = build_both(gpt_without_checkpoints(dir), "batch=2,seq=32,d=32,heads=2,layers=1", dir);
  const std::string flags = fmt::format("{} {} --steps 20 --checkpoint-every 0", kCommon, kGptData);
  const std::string mpirun = napkin::testing::data_parallel::mpirun(2);
  auto job = [&](const std::string& name, const std::string& extra, const std::string& env = "") {
    Run r = sh(fmt::format("{} NAPKIN_FAKE_NCCL_REPORT={} NAPKIN_FAKE_CUDA_SOURCE={} LD_LIBRARY_PATH={} {} {} {} "
                           "--metrics {} {}",
                           env, dir / name, micro.cuda_source, kFakeCudaDir, mpirun, micro.cuda, flags,
                           dir / (name + ".jsonl"), extra));
    INFO(name << ": " << r.out);
    REQUIRE(r.status == 0);
    return r;
  };
  job("plain", "");
  const Run zero = job("zero", "--zero 2");
  CHECK(zero.out.find("ZeRO-2     rank 0 updates") != std::string::npos);
  CHECK(zero.out.find("gradients reduced by NCCL 2.28.0 onto each gradient's owner on the GPU") != std::string::npos);
  check_close(losses(dir / "plain.jsonl"), losses(dir / "zero.jsonl"), 1e-6);
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    const nlohmann::json calls = nccl_report(dir / "zero", rank);
    CHECK(calls.at("reduce").get<int64_t>() > 0);      // the gradients, onto their owners
    CHECK(calls.at("all_reduce").get<int64_t>() > 0);  // the clipping norm's parts
    CHECK(calls.at("broadcast").get<int64_t>() > 0);   // the parameters from their owners after each update
  }
  // Small buckets, each reduced as soon as the backward has written it, on a second stream; the same with the
  // work run as late as a GPU may run it, and without graphs.
  for (const std::string env : {"", "NAPKIN_FAKE_CUDA_DEFER=1", "NAPKIN_CUDA_GRAPHS=0"}) {
    CAPTURE(env);
    const std::string name = fmt::format("buckets{}", env.size());
    const Run r = job(name, "--zero 2 --bucket-mib 0.01", env);
    CHECK(r.out.find("onto each gradient's owner on the GPU in 4 buckets") != std::string::npos);
    check_close(losses(dir / "plain.jsonl"), losses(dir / (name + ".jsonl")), 1e-6);
  }
  // Two micro-batches: through the host.
  job("plain2", "--accumulate 2");
  const Run accumulated = job("zero2", "--zero 2 --accumulate 2");
  CHECK(accumulated.out.find("gradients reduce-scattered by MPI on the host") != std::string::npos);
  check_close(losses(dir / "plain2.jsonl"), losses(dir / "zero2.jsonl"), 1e-6);
  CHECK(nccl_report(dir / "zero2", 0).at("all_reduce").get<int64_t>() > 0);
  // The CPU trainer of the same model under --zero 2: the same training.
  Run cpu = sh(fmt::format("{} {} {} --metrics {} --zero 2", mpirun, micro.cpu, flags, dir / "cpu.jsonl"));
  INFO(cpu.out);
  REQUIRE(cpu.status == 0);
  check_close(losses(dir / "cpu.jsonl"), losses(dir / "zero.jsonl"), 1e-5);
}

// ZeRO-3 on 2 fake GPUs (docs/distributed.md): a trainer built with `napkin
// build --zero 3` gathers each parameter from its owner (ncclBroadcast) and
// reduces each gradient onto it (ncclReduce) on the GPU, in the step's
// stream and graphs, and the clipping norm's parts are summed there
// (ncclAllReduce): no collective kernel goes through the host. It trains as
// plain NCCL data parallel does (the gradient sums in another order), with
// and without accumulation, under bf16-mixed, under fp16-mixed with the same
// overflow skips, and without graphs bit for bit as with them; a checkpoint
// of its 2 ranks resumes on 1 fake GPU at the same loss.
TEST_CASE("fake cuda: --zero 3 on 2 fake GPUs gathers and reduces through NCCL on the device, as plain data parallel trains (issue 40)") {
  REQUIRE(sh("command -v mpirun").status == 0);
  for (const std::string precision : {"fp32", "bf16-mixed", "{policy: fp16-mixed, loss_scale: {init: 1073741824}}"}) {
    CAPTURE(precision);
    TempDir dir("fakecuda-zero3");
    const std::string model = gpt_without_checkpoints(dir, precision);
    const std::string dims = "batch=2,seq=32,d=32,heads=2,layers=1";
    TempDir plain_dir("fakecuda-zero3-plain");
    const Trainers plain = build_both(model, dims, plain_dir);
    const Trainers sharded = build_both(model, dims, dir, "--zero 3");
    const bool fp32 = precision == "fp32", fp16 = precision.find("fp16") != std::string::npos;
    const std::string mpirun = napkin::testing::data_parallel::mpirun(2);
    // 3 eval batches every 10 steps on 2 ranks: the second rank's last forward gathers with the first's and is
    // not counted.
    auto job = [&](const Trainers& t, const std::string& name, const std::string& extra, const std::string& env = "") {
      Run r = sh(fmt::format("{} NAPKIN_FAKE_NCCL_REPORT={} NAPKIN_FAKE_CUDA_SOURCE={} LD_LIBRARY_PATH={} {} {} "
                             "--order sequential --seed 0 --log-every 1 --eval-every 10 --eval-batches 3 {} "
                             "--metrics {} {}",
                             env, dir / name, t.cuda_source, kFakeCudaDir, mpirun, t.cuda, kGptData,
                             dir / (name + ".jsonl"), extra));
      INFO(name << ": " << r.out);
      REQUIRE(r.status == 0);
      return r;
    };
    for (const std::string accumulate : {"1", "2"}) {
      CAPTURE(accumulate);
      if (!fp32 && accumulate == "2") continue;
      const std::string flags = fmt::format("--steps 20 --checkpoint-every 0 --accumulate {}", accumulate);
      // fp16: the last step saved in one file, for its loss scale.
      auto saved = [&](const std::string& name) {
        return fp16 ? fmt::format(" --checkpoint-format single --checkpoint-dir {}", dir / name) : std::string();
      };
      job(plain, "plain" + accumulate, flags + saved("plain-ckpt"));
      const Run zero = job(sharded, "zero" + accumulate, flags + saved("zero-ckpt"));
      CHECK(zero.out.find("parameters gathered and gradients reduced by NCCL 2.28.0 on the GPU in the step") !=
            std::string::npos);
      // One micro-batch: the step's reduces average on the GPU, no host sum; two: the owner's sums on the host.
      CHECK((zero.out.find("this rank's f32 sum of its own parameters' gradients (ZeRO-3)") != std::string::npos) ==
            (accumulate == "2"));
      const std::vector<double> want = losses(dir / ("plain" + accumulate + ".jsonl"));
      REQUIRE(want.size() == 20);
      check_close(want, losses(dir / ("zero" + accumulate + ".jsonl")), 1e-6);
      const std::vector<double> evals = eval_losses(dir / ("plain" + accumulate + ".jsonl"));
      REQUIRE(evals.size() == 2);
      check_close(evals, eval_losses(dir / ("zero" + accumulate + ".jsonl")), 1e-6);
      for (int rank = 0; rank < 2; ++rank) {
        CAPTURE(rank);
        const nlohmann::json calls = nccl_report(dir / ("zero" + accumulate), rank);
        CHECK(calls.at("broadcast").get<int64_t>() > 0);
        CHECK(calls.at("reduce").get<int64_t>() > 0);
        CHECK(calls.at("all_reduce").get<int64_t>() > 0);  // the clipping norm's parts (and fp16's probe)
      }
    }
    if (fp16) {
      // Loss scale 2^30 overflows at first: each skipped step halves it, on every rank together, as plain's.
      const float scale = loss_scale(dir / "zero-ckpt/step-000020.safetensors");
      MESSAGE(fmt::format("fp16-mixed: loss scale 2^30 after 20 steps: {}", scale));
      CHECK(scale < 1073741824.0f);
      CHECK(scale == loss_scale(dir / "plain-ckpt/step-000020.safetensors"));
    }
    if (!fp32) continue;
    // Without NCCL a GPU's ZeRO-3 is refused before step 1, saying why and what runs instead.
    Run refused = sh(fmt::format("NAPKIN_NCCL=0 NAPKIN_FAKE_CUDA_SOURCE={} LD_LIBRARY_PATH={} {} {} {} {} --steps 1 "
                                 "--checkpoint-every 0",
                                 sharded.cuda_source, kFakeCudaDir, mpirun, sharded.cuda, kCommon, kGptData));
    INFO(refused.out);
    CHECK(refused.status != 0);
    CHECK(refused.out.find("--zero 3 on GPUs runs the step's gathers and reduces through NCCL, and NCCL cannot be "
                           "used here: NAPKIN_NCCL=0") != std::string::npos);
    // Without CUDA graphs, each NCCL call enqueued every step rather than captured once: the same bits.
    job(sharded, "eager", "--steps 20 --checkpoint-every 0", "NAPKIN_CUDA_GRAPHS=0");
    CHECK(losses(dir / "eager.jsonl") == losses(dir / "zero1.jsonl"));
    CHECK(nccl_report(dir / "eager", 0).at("broadcast").get<int64_t>() >
          nccl_report(dir / "zero1", 0).at("broadcast").get<int64_t>());
    // A checkpoint of the 2 ranks × 2 micro-batches at step 10 (one shard each) resumes on 1 fake GPU
    // accumulating 4: the same global batch, and the 2 ranks' loss at step 11.
    job(sharded, "first", fmt::format("--steps 10 --accumulate 2 --checkpoint-dir {}", dir / "ckpt"));
    Run resumed = run_cuda(sharded, fmt::format("{} {} --steps 11 --accumulate 4 --metrics {} --resume {}", kCommon,
                                                kGptData, dir / "resumed.jsonl", dir / "ckpt/step-000010.sharded"));
    INFO(resumed.out);
    REQUIRE(resumed.status == 0);
    const std::vector<double> straight = losses(dir / "zero2.jsonl"), after = losses(dir / "resumed.jsonl");
    REQUIRE(after.size() == 1);
    check_close({straight.at(10)}, after, 1e-6);
  }
}

TEST_CASE("fake cuda: napkin sample's decoder (prefill, KV-cache decode steps) writes on the fake GPU what it writes on the CPU") {
  TempDir dir("fakecuda-sample");
  // A checkpoint of a few CPU steps, then both samplers from it, greedy.
  Trainers trainer = build_both("models/gpt.yaml", kGptDims, dir);
  Run trained = sh(fmt::format("{} {} {} --steps 6 --quiet --checkpoint-dir {} --metrics {}", trainer.cpu, kCommon,
                               kGptData, dir / "ckpt", dir / "m.jsonl"));
  INFO(trained.out);
  REQUIRE(trained.status == 0);
  Trainers s{dir / "sampler-cuda", dir / "sampler-cuda.cu", dir / "sampler-cpu"};
  Run cuda = sh(fmt::format("NAPKIN_CACHE_DIR={} {} build models/gpt.yaml --dims {} --sampler --target cuda -o {} "
                            "--emit-cuda {} --quiet",
                            dir / "nvrtc-cache", NAPKIN_BINARY, kGptDims, s.cuda, s.cuda_source));
  INFO(cuda.out);
  REQUIRE(cuda.status == 0);
  Run cpu = sh(fmt::format("{} build models/gpt.yaml --dims {} --sampler -o {} --quiet", NAPKIN_BINARY, kGptDims, s.cpu));
  INFO(cpu.out);
  REQUIRE(cpu.status == 0);
  // 40 tokens after a prompt of 5 in a context of 32: a prefill, decode steps, and a second prefill of the window.
  const std::string flags = fmt::format("--checkpoint {} --prompt 'napki' --tokens 40 --temperature 0", dir / "ckpt");
  // stdout alone into a file (the command's own output has stderr too).
  Run on_cpu = sh(fmt::format("({} {} > {})", s.cpu, flags, dir / "cpu.txt"));
  Run on_gpu = sh(fmt::format("(NAPKIN_FAKE_CUDA_SOURCE={} LD_LIBRARY_PATH={} {} {} > {})", s.cuda_source, kFakeCudaDir,
                              s.cuda, flags, dir / "gpu.txt"));
  INFO(on_gpu.out);
  REQUIRE(on_cpu.status == 0);
  REQUIRE(on_gpu.status == 0);
  const std::string cpu_text = read_bytes(dir / "cpu.txt"), gpu_text = read_bytes(dir / "gpu.txt");
  REQUIRE(cpu_text.size() == 5 + 40 + 1);
  CHECK(on_gpu.out.find("went in again") != std::string::npos);
  // Greedy choices of fp32 logits summed in other orders (cuBLASLt's fake in
  // double): the same text unless two logits tie within those roundings.
  CHECK(gpu_text.substr(0, 25) == cpu_text.substr(0, 25));
}

// The fake's virtual memory management (fake_cuda.h), called as the arena
// (runtime/cuda/device_arena.h) calls it: granules are device memory only
// while mapped and accessible, an unmap gives the pages back, and touching
// an unmapped granule faults.
TEST_CASE("fake cuda: virtual memory: granules mapped, made accessible, unmapped, and an unmapped one faults") {
  const std::string& dir = kFakeCudaDir;
  void* cuda = dlopen((dir + "/libcuda.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(cuda != nullptr);
  using MappedBytes = int64_t (*)();
  auto mapped = reinterpret_cast<MappedBytes>(dlsym(cuda, "napkin_fake_cuda_mapped_bytes"));
  REQUIRE(static_cast<bool>(mapped));
  napkin::runtime::cuda::CudaDriver d((dir + "/libcuda.so.1").c_str());
  CHECK(d.missing_vmm() == "");
  REQUIRE(d.cuInit(0) == CUDA_SUCCESS);
  CUdevice device = 0;
  CUcontext context = nullptr;
  REQUIRE(d.cuDeviceGet(&device, 0) == CUDA_SUCCESS);
  REQUIRE(d.cuDevicePrimaryCtxRetain(&context, device) == CUDA_SUCCESS);
  REQUIRE(d.cuCtxSetCurrent(context) == CUDA_SUCCESS);
  int supported = 0;
  REQUIRE(d.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) ==
          CUDA_SUCCESS);
  CHECK(supported == 1);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  size_t granule = 0;
  REQUIRE(d.cuMemGetAllocationGranularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
  CHECK(granule == (2u << 20));
  const int64_t before = mapped();

  CUdeviceptr base = 0;
  CHECK(d.cuMemAddressReserve(&base, granule + 1, 0, 0, 0) == CUDA_ERROR_INVALID_VALUE);  // whole granules only
  REQUIRE(d.cuMemAddressReserve(&base, 3 * granule, granule, 0, 0) == CUDA_SUCCESS);
  CHECK(base % granule == 0);
  CUmemGenericAllocationHandle h[3] = {};
  for (auto& handle : h) REQUIRE(d.cuMemCreate(&handle, granule, &prop, 0) == CUDA_SUCCESS);
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  REQUIRE(d.cuMemMap(base, granule, 0, h[0], 0) == CUDA_SUCCESS);
  REQUIRE(d.cuMemMap(base + 2 * granule, granule, 0, h[2], 0) == CUDA_SUCCESS);
  CHECK(d.cuMemMap(base + 2 * granule, granule, 0, h[1], 0) == CUDA_ERROR_INVALID_VALUE);  // already mapped there
  CHECK(mapped() - before == static_cast<int64_t>(2 * granule));
  CUstream stream = nullptr;
  REQUIRE(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CHECK(d.cuMemsetD8Async(base, 0, 16, stream) == CUDA_ERROR_INVALID_VALUE);  // mapped, not yet accessible
  CHECK(d.cuMemSetAccess(base, 3 * granule, &access, 1) == CUDA_ERROR_INVALID_VALUE);  // the middle is a hole
  REQUIRE(d.cuMemSetAccess(base, granule, &access, 1) == CUDA_SUCCESS);
  REQUIRE(d.cuMemSetAccess(base + 2 * granule, granule, &access, 1) == CUDA_SUCCESS);
  auto* bytes = reinterpret_cast<unsigned char*>(base);
  CHECK(bytes[granule - 1] == 0xff);  // fresh device memory is NaN bytes
  REQUIRE(d.cuMemsetD8Async(base, 0, granule, stream) == CUDA_SUCCESS);
  REQUIRE(d.cuStreamSynchronize(stream) == CUDA_SUCCESS);
  CHECK(bytes[granule - 1] == 0);
  CHECK(d.cuMemsetD8Async(base + granule - 8, 0, 16, stream) == CUDA_ERROR_INVALID_VALUE);  // into the unmapped one

  // A touch of an unmapped granule faults, in a child process; a mapped one does not.
  auto touch = [&](CUdeviceptr at) {
    pid_t child = fork();
    if (child == 0) {
      std::signal(SIGSEGV, SIG_DFL);  // not doctest's crash report
      *reinterpret_cast<volatile unsigned char*>(at) = 1;
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return status;
  };
  CHECK(touch(base + 2 * granule) == 0);
  const int faulted = touch(base + granule);
  CHECK(WIFSIGNALED(faulted));
  CHECK(WTERMSIG(faulted) == SIGSEGV);

  CHECK(d.cuMemUnmap(base + 2 * granule, granule / 2) == CUDA_ERROR_INVALID_VALUE);  // part of a mapping
  CHECK(d.cuMemAddressFree(base, 3 * granule) == CUDA_ERROR_INVALID_VALUE);          // still mapped
  REQUIRE(d.cuMemUnmap(base + 2 * granule, granule) == CUDA_SUCCESS);
  CHECK(mapped() - before == static_cast<int64_t>(granule));
  CHECK(WTERMSIG(touch(base + 2 * granule)) == SIGSEGV);
  REQUIRE(d.cuMemUnmap(base, granule) == CUDA_SUCCESS);
  for (auto& handle : h) CHECK(d.cuMemRelease(handle) == CUDA_SUCCESS);
  CHECK(d.cuMemRelease(h[0]) == CUDA_ERROR_INVALID_VALUE);
  CHECK(d.cuMemAddressFree(base, 3 * granule) == CUDA_SUCCESS);
  CHECK(mapped() == before);
  CHECK(d.cuStreamDestroy(stream) == CUDA_SUCCESS);
  CHECK(d.cuDevicePrimaryCtxRelease(device) == CUDA_SUCCESS);
  dlclose(cuda);
}

// The CUDA engine's arena on the fake GPU: released bytes noted before the
// first work are never mapped, released after it are unmapped, and only
// granules with nothing else in them go (the reservation's bytes outside the
// arena count as nothing). An arena of 5 MiB + 1000 bytes: 3 granules, the
// arena starting pad = 1 MiB - 1024 bytes into the first.
TEST_CASE("cuda device arena: maps every granule but those wholly inside released bytes, before or after the first work") {
  const std::string& dir = kFakeCudaDir;
  napkin::runtime::cuda::CudaDriver d((dir + "/libcuda.so.1").c_str());
  REQUIRE(d.cuInit(0) == CUDA_SUCCESS);
  CUdevice device = 0;
  CUcontext context = nullptr;
  REQUIRE(d.cuDeviceGet(&device, 0) == CUDA_SUCCESS);
  REQUIRE(d.cuDevicePrimaryCtxRetain(&context, device) == CUDA_SUCCESS);
  REQUIRE(d.cuCtxSetCurrent(context) == CUDA_SUCCESS);
  CUstream stream = nullptr;
  REQUIRE(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  const int64_t MiB = 1 << 20, pad = MiB - 1024;
  {
    napkin::runtime::cuda::DeviceArena arena(d, device, static_cast<size_t>(5 * MiB + 1000));
    REQUIRE(arena.virtual_memory());
    CHECK(arena.granularity() == 2 * MiB);
    CHECK(arena.reserved_bytes() == 6 * MiB);
    CHECK((arena.base() - pad) % (2 * MiB) == 0);
    arena.release(MiB + 1024, 2 * MiB);  // granule 1, exactly
    arena.release(0, 100);               // inside granule 0 with other bytes
    CHECK(arena.mapped_bytes() == 0);    // nothing mapped before the first work
    arena.back(stream);
    CHECK(arena.mapped_bytes() == 4 * MiB);
    REQUIRE(d.cuStreamSynchronize(stream) == CUDA_SUCCESS);
    const auto* bytes = reinterpret_cast<const unsigned char*>(arena.base());
    CHECK(bytes[0] == 0);  // zero-filled (the fake's fresh memory is 0xff)
    CHECK(bytes[5 * MiB + 999] == 0);
    CHECK(d.cuMemsetD8Async(arena.base() + MiB + 1024, 1, 1, stream) == CUDA_ERROR_INVALID_VALUE);  // never mapped

    arena.release(3 * MiB + 1024, MiB);              // half of granule 2
    CHECK(arena.mapped_bytes() == 4 * MiB);
    arena.release(4 * MiB + 1024, MiB - 24);         // the rest of it, to the arena's end
    CHECK(arena.mapped_bytes() == 2 * MiB);
    arena.release(100, MiB);                         // granule 0 but its last 924 bytes
    CHECK(arena.mapped_bytes() == 2 * MiB);
    arena.release(MiB + 100, 924);
    CHECK(arena.mapped_bytes() == 0);
    CHECK(arena.peak_mapped_bytes() == 4 * MiB);
  }
  CHECK(d.cuStreamDestroy(stream) == CUDA_SUCCESS);
  CHECK(d.cuDevicePrimaryCtxRelease(device) == CUDA_SUCCESS);
}

namespace {

// The arena bytes a rank maps (runtime/cuda/device_arena.h): its reservation
// of whole granules, less each granule lying wholly inside `released`
// (arena byte ranges) and the reservation's bytes outside the arena. Arena
// offset o is at reservation + pad + o.
int64_t expected_mapped(int64_t arena_bytes, std::vector<std::pair<int64_t, int64_t>> released) {
  const int64_t granule = 2 << 20;
  const int64_t reserved = (arena_bytes + granule - 1) / granule * granule;
  const int64_t pad = reserved - (arena_bytes + 255) / 256 * 256;
  released.push_back({-pad, 0});
  released.push_back({arena_bytes, reserved - pad});
  std::sort(released.begin(), released.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (auto [from, to] : released) {
    if (!merged.empty() && from <= merged.back().second) merged.back().second = std::max(merged.back().second, to);
    else merged.push_back({from, to});
  }
  int64_t mapped = reserved;
  for (int64_t g = 0; g < reserved / granule; ++g) {
    const int64_t first = g * granule - pad, last = first + granule;
    for (auto [from, to] : merged)
      if (from <= first && last <= to) mapped -= granule;
  }
  return mapped;
}

// NAPKIN_FAKE_CUDA_REPORT's file of one rank.
nlohmann::json fake_report(const std::string& prefix, int rank) {
  return nlohmann::json::parse(read_bytes(fmt::format("{}.{}.json", prefix, rank)));
}

}  // namespace

// ZeRO-1 on fake GPUs with virtual memory management: each rank's arena maps
// every granule but those lying wholly inside the other rank's optimizer
// state (counted by the fake driver itself), it trains bit for bit as plain
// data parallel, a single-file checkpoint (rank 0 gathers the others' state
// through its host copies, never the unmapped granules) is the plain run's,
// and a run resumed from it maps no more and goes on as the plain run. An MLP with a 1024 x 1024 hidden layer: w2's AdamW state (8 MiB)
// is rank 0's, so rank 1 unmaps it. Without virtual memory management the
// arena is one cuMemAlloc and nothing is given back.
TEST_CASE("fake cuda: a ZeRO-1 rank maps only its share of the arena, trains as plain data parallel, and one GPU maps it all") {
  REQUIRE(sh("command -v mpirun").status == 0);
  TempDir dir("fakecuda-vmm");
  const Trainers t = build_both("models/mlp.yaml", "batch=8,d_in=64,hidden=1024", dir);
  const std::string flags = fmt::format("{} --data-file images=tests/e2e/data/mlp/images.npy "
                                        "--data-file labels=tests/e2e/data/mlp/labels.npy --checkpoint-format single",
                                        kCommon);
  const std::string mpirun = napkin::testing::data_parallel::mpirun(2);
  Run printed = sh(t.cuda + " --print-program");
  REQUIRE(printed.status == 0);
  const napkin::runtime::Program program = napkin::runtime::parse_program(printed.out.data(), printed.out.size());
  const int64_t granule = 2 << 20;
  const int64_t reserved = (program.arena_bytes + granule - 1) / granule * granule;

  auto job = [&](const std::string& name, const std::string& more, const std::string& env = "") {
    Run r = sh(fmt::format("{} NAPKIN_FAKE_CUDA_REPORT={} NAPKIN_FAKE_CUDA_SOURCE={} LD_LIBRARY_PATH={} {} {} {} "
                           "--metrics {} --checkpoint-dir {} {}",
                           env, dir / name, t.cuda_source, kFakeCudaDir, mpirun, t.cuda, flags, dir / (name + ".jsonl"),
                           dir / (name + "-ckpt"), more));
    INFO(name << ": " << r.out);
    REQUIRE(r.status == 0);
    return r;
  };
  const Run plain = job("plain", "--steps 5 --checkpoint-every 3");
  const std::string whole_mib = fmt::format("{:.1f} MiB", static_cast<double>(reserved) / (1 << 20));
  CHECK(plain.out.find(fmt::format("device     arena {} mapped of {} reserved, in 2.0 MiB granules\n", whole_mib,
                                   whole_mib)) != std::string::npos);
  // Its work run as late as a GPU may run it: nothing queued may reach a granule after it is unmapped.
  const Run zero = job("zero", "--steps 3 --zero 1", "NAPKIN_FAKE_CUDA_DEFER=1");
  CHECK(zero.out.find("(ZeRO-1: the other ranks' optimizer state unmapped)") != std::string::npos);
  const std::vector<double> plain_losses = losses(dir / "plain.jsonl");
  REQUIRE(plain_losses.size() == 5);
  CHECK(losses(dir / "zero.jsonl") == std::vector<double>(plain_losses.begin(), plain_losses.begin() + 3));
  CHECK(napkin::testing::checkpoint_content(dir / "zero-ckpt/step-000003.safetensors") ==
        napkin::testing::checkpoint_content(dir / "plain-ckpt/step-000003.safetensors"));
  // Resumed from it, each rank loads its own state (the others' never mapped) and goes on as the plain run.
  job("resumed", fmt::format("--steps 5 --zero 1 --resume {}", dir / "zero-ckpt/step-000003.safetensors"));
  CHECK(losses(dir / "resumed.jsonl") == std::vector<double>(plain_losses.begin() + 3, plain_losses.end()));
  CHECK(napkin::testing::checkpoint_content(dir / "resumed-ckpt/step-000005.safetensors") ==
        napkin::testing::checkpoint_content(dir / "plain-ckpt/step-000005.safetensors"));

  int64_t saved = 0;
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    const nlohmann::json whole = fake_report(dir / "plain", rank), share = fake_report(dir / "zero", rank);
    CHECK(whole.at("peak_mapped_bytes").get<int64_t>() == reserved);
    napkin::runtime::OptimizerShards shards(program, 2, rank);
    std::vector<std::pair<int64_t, int64_t>> others;
    for (const napkin::runtime::TensorSpec* s : shards.others_state()) others.push_back({s->offset, s->offset + s->bytes});
    const int64_t expected = expected_mapped(program.arena_bytes, others);
    CHECK(share.at("peak_mapped_bytes").get<int64_t>() == expected);
    CHECK(fake_report(dir / "resumed", rank).at("peak_mapped_bytes").get<int64_t>() == expected);
    CHECK(share.at("mapped_bytes").get<int64_t>() == 0);  // the engine's tear-down unmapped it all
    saved = std::max(saved, reserved - expected);
  }
  MESSAGE(fmt::format("arena {} bytes reserved; the rank that saves most maps {} MiB less", reserved, saved >> 20));
  CHECK(saved >= 3 * granule);

  // One GPU maps the whole arena.
  Run one = sh(fmt::format("NAPKIN_FAKE_CUDA_REPORT={} NAPKIN_FAKE_CUDA_SOURCE={} LD_LIBRARY_PATH={} {} {} --steps 1 --quiet",
                           dir / "one", t.cuda_source, kFakeCudaDir, t.cuda, flags));
  INFO(one.out);
  REQUIRE(one.status == 0);
  CHECK(fake_report(dir / "one", 0).at("peak_mapped_bytes").get<int64_t>() == reserved);

  // Without virtual memory management: one cuMemAlloc, the same bits, nothing given back.
  const Run old = job("no-vmm", "--steps 3 --zero 1", "NAPKIN_FAKE_CUDA_VMM=0");
  CHECK(old.out.find("in one cuMemAlloc (this GPU has no virtual memory management: the other ranks' optimizer state "
                     "stays mapped)") != std::string::npos);
  CHECK(losses(dir / "no-vmm.jsonl") == losses(dir / "zero.jsonl"));
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(fake_report(dir / "no-vmm", rank).at("peak_mapped_bytes").get<int64_t>() == 0);
    CHECK(fake_report(dir / "no-vmm", rank).at("peak_allocated_bytes").get<int64_t>() >= program.arena_bytes);
  }
}


// ZeRO-3 on 2 fake GPUs: each rank maps every granule but those lying
// wholly inside the other rank's optimizer state (ZeRO-1) and parameters,
// which its step gathers by ncclBroadcast into the arena's activations and
// never reads in place. An MLP with two 1024 x 1024 hidden layers and no
// biases: one batched AdamW kernel updates every parameter, which a GPU
// cannot split, so they are one unit (runtime/optimizer_shards.h) and rank
// 0 owns them all: it maps more than plain data parallel (the gathered
// copies and the local gradients besides the whole model), rank 1 far
// less, the two together less than two plain ranks. The same losses, with
// the work run as late as a GPU may run it (nothing queued reaches an
// unmapped granule).
TEST_CASE("fake cuda: each ZeRO-3 rank maps its share of the parameters and optimizer state, less than plain data parallel (issue 40)") {
  REQUIRE(sh("command -v mpirun").status == 0);
  TempDir dir("fakecuda-zero3-vmm");
  TempDir plain_dir("fakecuda-zero3-vmm-plain");
  write_bytes(dir / "mlp.yaml", R"(model: mlp2
dims: {batch: 8, d_in: 64, hidden: 1024, classes: 10}
inputs:
  images: {shape: [batch, d_in]}
  labels: {shape: [batch], dtype: i32}
params:
  w1: {shape: [d_in, hidden], init: xavier}
  w2: {shape: [hidden, hidden], init: xavier}
  w3: {shape: [hidden, hidden], init: xavier}
  w4: {shape: [hidden, classes], init: xavier}
forward:
  - h1: gelu(images @ w1)
  - h2: gelu(h1 @ w2)
  - h3: gelu(h2 @ w3)
  - logits: h3 @ w4
loss: cross_entropy(logits, labels)
optimizer: adamw(lr=1e-3, weight_decay=0.01)
precision: fp32
)");
  const Trainers plain = build_both(dir / "mlp.yaml", "batch=8", plain_dir);
  const Trainers sharded = build_both(dir / "mlp.yaml", "batch=8", dir, "--zero 3");
  const std::string flags = fmt::format("{} --data-file images=tests/e2e/data/mlp/images.npy "
                                        "--data-file labels=tests/e2e/data/mlp/labels.npy --steps 3 --checkpoint-every 0",
                                        kCommon);
  const std::string mpirun = napkin::testing::data_parallel::mpirun(2);
  auto job = [&](const Trainers& t, const std::string& name) {
    Run r = sh(fmt::format("NAPKIN_FAKE_CUDA_DEFER=1 NAPKIN_FAKE_CUDA_REPORT={} NAPKIN_FAKE_CUDA_SOURCE={} "
                           "LD_LIBRARY_PATH={} {} {} {} --metrics {} --collective-timeout 60",
                           dir / name, t.cuda_source, kFakeCudaDir, mpirun, t.cuda, flags, dir / (name + ".jsonl")));
    INFO(name << ": " << r.out);
    REQUIRE(r.status == 0);
    return r;
  };
  job(plain, "plain");
  job(sharded, "zero");
  check_close(losses(dir / "plain.jsonl"), losses(dir / "zero.jsonl"), 1e-6);
  Run printed = sh(sharded.cuda + " --print-program");
  REQUIRE(printed.status == 0);
  const napkin::runtime::Program program = napkin::runtime::parse_program(printed.out.data(), printed.out.size());
  int64_t wholes = 0, shares = 0;
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    const int64_t whole = fake_report(dir / "plain", rank).at("peak_mapped_bytes").get<int64_t>();
    const int64_t share = fake_report(dir / "zero", rank).at("peak_mapped_bytes").get<int64_t>();
    napkin::runtime::OptimizerShards shards(program, 2, rank);
    std::vector<std::pair<int64_t, int64_t>> others;
    for (const auto* tensors : {&shards.others_state(), &shards.others_params()})
      for (const napkin::runtime::TensorSpec* t : *tensors) others.push_back({t->offset, t->offset + t->bytes});
    const int64_t expected = expected_mapped(program.arena_bytes, others);
    MESSAGE(fmt::format("rank {}: plain data parallel maps {:.1f} MiB at peak, ZeRO-3 {:.1f} MiB (expected {:.1f} MiB)",
                        rank, static_cast<double>(whole) / (1 << 20), static_cast<double>(share) / (1 << 20),
                        static_cast<double>(expected) / (1 << 20)));
    CHECK(share == expected);
    // The update batch runs its members apart (its run mask), so each rank owns a share of the parameters:
    // w2 and w3 (1M elements each) on different ranks.
    CHECK(shards.owned_params() >= 1);
    CHECK(share < whole);
    wholes += whole;
    shares += share;
  }
  CHECK(shares < wholes);
}

#endif  // NAPKIN_HAVE_CUDA_RUNTIME
