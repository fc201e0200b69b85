// `napkin build --target cuda` end to end, on a machine that needs no GPU:
// the program description the build writes (the CUDA fields included)
// parses with the runtime's parser and names only functions the CUDA source
// defines; the executable links, prints its program, and without a GPU exits
// with status 1 saying so; a rebuild hits the kernel cache; bad flags are the
// user's errors. Built where the CUDA backend is (codegen/cuda, runtime/cuda).
#ifdef NAPKIN_HAVE_CUDA

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

#include "codegen/cuda/kernel_source.h"
#include "codegen/cuda/program_cuda.h"
#include "runtime/program.h"
#include "support/test_io.h"
#include "support/test_models.h"

using nlohmann::json;
using napkin::testing::read_bytes;
using napkin::testing::TempDir;
using Run = napkin::testing::CommandResult;

namespace {

Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

// `napkin build --target cuda` with the kernel cache in `cache`.
Run build(const std::string& args, const TempDir& cache) {
  return sh(fmt::format("NAPKIN_CACHE_DIR={} {} build --target cuda {}", cache.path, NAPKIN_BINARY, args));
}

// Every launch of the program names a function the CUDA source defines, and
// exactly the loop kernels have launches.
void check_launches(const napkin::runtime::Program& p, const std::string& cuda_source) {
  std::set<std::string> defined;
  static const std::regex kernel(R"(extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\()");
  for (auto m = std::sregex_iterator(cuda_source.begin(), cuda_source.end(), kernel); m != std::sregex_iterator(); ++m)
    defined.insert((*m)[1].str());
  REQUIRE(!defined.empty());
  for (const napkin::runtime::KernelSpec& k : p.kernels) {
    CAPTURE(k.name);
    CHECK((k.as<napkin::runtime::MatmulSpec>() != nullptr) == k.cuda_launches.empty());
    for (const napkin::runtime::CudaLaunchSpec& l : k.cuda_launches) {
      CAPTURE(l.function);
      CHECK(defined.count(l.function) == 1);
      CHECK(l.grid >= 1);
      CHECK(l.block >= 1);
      CHECK(l.block <= 1024);
      CHECK(l.shared_bytes >= 0);
    }
  }
}

}  // namespace

TEST_CASE("cuda build: the program description carries each loop kernel's launches and the CUDA fields") {
  napkin::ir::Graph g = napkin::testing::compile_training(napkin::testing::read_source("models/mlp.yaml"), "mlp.yaml");
  napkin::codegen::KernelPlan plan = napkin::codegen::plan_kernels(g);
  napkin::codegen::cuda::CudaSource source = napkin::codegen::cuda::emit_cuda_source(plan, g.name);
  napkin::codegen::ProgramFacts facts;
  facts.backend = "cuda";
  facts.device = "h100";
  std::string text = napkin::codegen::cuda::cuda_program_json(g, plan, source, facts, {"sm_90a", true});
  napkin::runtime::Program p = napkin::runtime::parse_program(text.data(), text.size());
  CHECK(p.backend == "cuda");
  CHECK(p.cuda.arch == "sm_90a");
  CHECK(p.cuda.tf32);
  CHECK(p.cuda.scratch_bytes == source.scratch_bytes);
  REQUIRE(p.kernels.size() == plan.kernels.size());
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    REQUIRE(p.kernels[i].cuda_launches.size() == source.launches[i].size());
    for (size_t j = 0; j < source.launches[i].size(); ++j) {
      CHECK(p.kernels[i].cuda_launches[j].function == source.launches[i][j].function);
      CHECK(p.kernels[i].cuda_launches[j].grid == source.launches[i][j].grid);
      CHECK(p.kernels[i].cuda_launches[j].block == source.launches[i][j].block);
      CHECK(p.kernels[i].cuda_launches[j].shared_bytes == source.launches[i][j].shared_bytes);
      CHECK(p.kernels[i].cuda_launches[j].offsets == source.launches[i][j].offsets);
    }
  }
  check_launches(p, source.text);
}

TEST_CASE("cuda build: napkin build --target cuda makes a trainer that prints its program and, with no GPU, says so") {
  TempDir dir("cudabuild"), cache("cudacache");
  const std::string trainer = dir / "linear";
  Run r = build(fmt::format("models/linear.yaml -o {} --emit-cuda {} --emit-program {} --time-passes", trainer,
                            dir / "linear.cu", dir / "linear.json"),
                cache);
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("cuda sm_90") != std::string::npos);
  CHECK(r.out.find("cubin ") != std::string::npos);
  CHECK(r.out.find("NVRTC 13") != std::string::npos);  // the version and time, not a cache hit
  CHECK(r.out.find("  link") != std::string::npos);
  struct stat st {};
  REQUIRE(::stat(trainer.c_str(), &st) == 0);
  CHECK((st.st_mode & S_IXUSR) != 0);
  CHECK(!std::filesystem::exists(trainer + ".o"));

  Run printed = sh(trainer + " --print-program");
  INFO(printed.out);
  REQUIRE(printed.status == 0);
  json program = json::parse(printed.out);
  CHECK(program == json::parse(read_bytes(dir / "linear.json")));
  CHECK(program["backend"] == "cuda");
  CHECK(program["device"] == "h100");
  CHECK(program["cuda"]["arch"] == "sm_90");
  CHECK(program["cuda"]["tf32"] == false);
  CHECK(program["peak_flops"] == 66.9e12);  // H100's fp32 (no TF32): linear is an fp32 model
  std::string text = printed.out;
  check_launches(napkin::runtime::parse_program(text.data(), text.size()), read_bytes(dir / "linear.cu"));

  // It starts on a GPU machine that has neither oneDNN nor the toolkit's
  // libraries: it needs no CUDA library at load time (libcuda and cuBLASLt
  // are opened when the engine starts) and not the CPU GEMM's oneDNN.
  Run needed = sh("readelf -d " + trainer);
  INFO(needed.out);
  REQUIRE(needed.status == 0);
  CHECK(needed.out.find("(NEEDED)") != std::string::npos);
  for (const char* library : {"libdnnl", "libcuda", "libcublas", "libnvrtc", "libcudart"})
    CHECK(needed.out.find(library) == std::string::npos);

  Run run = sh(trainer + " --steps 1");
  INFO(run.out);
  CHECK(run.status == 1);
  CHECK(run.out.find("NVIDIA GPU") != std::string::npos);
  CHECK(run.out.find("--target cpu") != std::string::npos);

  SUBCASE("a rebuild is a kernel cache hit; --no-cache runs NVRTC") {
    Run again = build(fmt::format("models/linear.yaml -o {}", trainer), cache);
    INFO(again.out);
    REQUIRE(again.status == 0);
    CHECK(again.out.find("NVRTC cache hit") != std::string::npos);
    Run fresh = build(fmt::format("models/linear.yaml -o {} --no-cache", trainer), cache);
    INFO(fresh.out);
    REQUIRE(fresh.status == 0);
    CHECK(fresh.out.find("cache hit") == std::string::npos);
  }
  SUBCASE("--tf32, --arch and --device reach the program") {
    Run other = build(fmt::format("models/linear.yaml -o {} --tf32 --arch sm_80 --device a100", trainer), cache);
    INFO(other.out);
    REQUIRE(other.status == 0);
    json p = json::parse(sh(trainer + " --print-program").out);
    CHECK(p["cuda"]["arch"] == "sm_80");
    CHECK(p["cuda"]["tf32"] == true);
    CHECK(p["device"] == "a100");
    CHECK(p["peak_flops"] == 156e12);  // A100's TF32
  }
}

TEST_CASE("cuda build: napkin train --target cuda builds (cached) and runs the CUDA trainer") {
  TempDir cache("cudatrain");
  Run r = sh(fmt::format("XDG_CACHE_HOME={} {} train models/linear.yaml --target cuda -- --steps 1", cache.path,
                         NAPKIN_BINARY));
  INFO(r.out);
  CHECK(r.out.find("napkin: built linear") != std::string::npos);
  CHECK(r.status == 1);  // no GPU here: the trainer itself says so
  CHECK(r.out.find("runs its step on an NVIDIA GPU") != std::string::npos);
  Run again = sh(fmt::format("XDG_CACHE_HOME={} {} train models/linear.yaml --target cuda -- --print-program", cache.path,
                             NAPKIN_BINARY));
  INFO(again.out);
  CHECK(again.status == 0);
  CHECK(again.out.find("using the cached trainer") != std::string::npos);
  CHECK(again.out.find("\"backend\": \"cuda\"") != std::string::npos);
}

TEST_CASE("cuda build: every kernel kind of a transformer compiles with NVRTC") {
  TempDir dir("cudabuild"), cache("cudacache");
  Run r = build(fmt::format("models/gpt.yaml --dims batch=2,seq=16,d=32,layers=2 -o {}", dir / "gpt"), cache);
  INFO(r.out);
  REQUIRE(r.status == 0);
  Run printed = sh(dir / "gpt" + " --print-program");
  REQUIRE(printed.status == 0);
  napkin::runtime::Program p = napkin::runtime::parse_program(printed.out.data(), printed.out.size());
  CHECK(p.backend == "cuda");
  CHECK(p.cuda.arch == "sm_90");
}

TEST_CASE("cuda build: --classifier-chunk sizes the fused classifier's vocabulary chunks") {
  TempDir dir("cudabuild"), cache("cudacache");
  // 2 x 64 rows of bf16 logits: 64 KiB holds 256 classes a chunk; the default 32 MiB the whole vocabulary.
  for (const auto& [flag, chunk] : {std::pair<std::string, int64_t>{"", 50257}, {"--classifier-chunk 64KiB", 256}}) {
    CAPTURE(flag);
    Run r = build(fmt::format("models/gpt2-124m.yaml --dims layers=1,seq=64,batch=2 -o {} --emit-program {} --quiet {}",
                              dir / "t", dir / "p.json", flag),
                  cache);
    REQUIRE(r.status == 0);
    const std::string text = read_bytes(dir / "p.json");
    napkin::runtime::Program p = napkin::runtime::parse_program(text.data(), text.size());
    int classifiers = 0;
    for (const napkin::runtime::KernelSpec& k : p.kernels) {
      const auto* classifier = k.as<napkin::runtime::ClassifierSpec>();
      if (!classifier) continue;
      ++classifiers;
      REQUIRE(classifier->cuda);
      CHECK(classifier->cuda->chunk == chunk);
      CHECK(classifier->cuda->chunks == (50257 + chunk - 1) / chunk);
      CHECK(static_cast<int64_t>(k.cuda_launches.size()) >= classifier->cuda->chunks);
    }
    CHECK(classifiers == 2);  // forward and backward
  }
}

TEST_CASE("cuda build: the user's mistakes in CUDA flags") {
  TempDir dir("cudabuild"), cache("cudacache");
  Run bad_arch = build(fmt::format("models/linear.yaml -o {} --arch sm_7", dir / "t"), cache);
  CHECK(bad_arch.status == 1);
  CHECK(bad_arch.out.find("error: --arch sm_7: not a GPU architecture") != std::string::npos);
  CHECK(bad_arch.out.find("sm_90") != std::string::npos);
  Run llvm = build(fmt::format("models/linear.yaml -o {} --emit-llvm {}", dir / "t", dir / "t.ll"), cache);
  CHECK(llvm.status == 1);
  CHECK(llvm.out.find("--emit-llvm is for --target cpu") != std::string::npos);
  Run bad_chunk = build(fmt::format("models/linear.yaml -o {} --classifier-chunk 12XB", dir / "t"), cache);
  CHECK(bad_chunk.status == 1);
  CHECK(bad_chunk.out.find("error: --classifier-chunk: '12XB': unknown unit") != std::string::npos);
  Run zero_chunk = build(fmt::format("models/linear.yaml -o {} --classifier-chunk 0", dir / "t"), cache);
  CHECK(zero_chunk.status == 1);
  CHECK(zero_chunk.out.find("error: --classifier-chunk") != std::string::npos);
  Run cpu_chunk = sh(fmt::format("{} build models/linear.yaml -o {} --classifier-chunk 1MiB", NAPKIN_BINARY, dir / "t"));
  CHECK(cpu_chunk.status == 1);
  CHECK(cpu_chunk.out.find("are for --target cuda") != std::string::npos);
  Run cpu_arch = sh(fmt::format("{} build models/linear.yaml -o {} --arch sm_90", NAPKIN_BINARY, dir / "t"));
  CHECK(cpu_arch.status == 1);
  CHECK(cpu_arch.out.find("are for --target cuda") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "t"));
}

#endif  // NAPKIN_HAVE_CUDA
