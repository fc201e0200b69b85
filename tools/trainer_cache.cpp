#include "tools/trainer_cache.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "analysis/devices.h"
#include "codegen/cpu/build.h"
#include "codegen/cpu/link_config.h"
#ifdef NAPKIN_HAVE_CUDA
#include "codegen/cuda/build.h"
#endif
#include "ir/printer.h"
#include "tools/files.h"
#include "tools/trainer_build.h"

namespace napkin::tools {

std::filesystem::path trainer_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::filesystem::path(x) / "napkin";
  if (const char* h = std::getenv("HOME"); h && *h) return std::filesystem::path(h) / ".cache" / "napkin";
  return std::filesystem::temp_directory_path() / "napkin-cache";
}

namespace {

std::string cache_key(const ir::Graph& g, const std::string& target, const std::string& model_hash,
                      const ir::Graph* sampler) {
  std::string runtime = read_file_bytes(codegen::cpu::kRuntimeLibrary);
#ifdef NAPKIN_HAVE_CUDA
  if (target == "cuda") runtime += read_file_bytes(codegen::cuda::cuda_runtime_library());
#endif
  return fnv1a_hex({ir::print_graph(g, {false}), sampler ? ir::print_graph(*sampler, {false}) : "", target, model_hash,
                    read_file_bytes("/proc/self/exe"), runtime,
                    analysis::devices_to_json(analysis::known_devices())});
}

// Builds g's trainer for `target` into `output`; false when the build failed
// with a message the user can act on (printed).
bool build_into(const ir::Graph& g, const std::string& target, const std::string& model_hash, const ir::Graph* sampler,
                const std::string& output) {
#ifdef NAPKIN_HAVE_CUDA
  if (target == "cuda") {
    codegen::cuda::CudaBuildOptions options;
    options.output = output;
    options.model_hash = model_hash;
    return build_or_report(codegen::cuda::build_cuda_trainer, g, options).has_value();
  }
#endif
  return build_or_report(codegen::cpu::build_cpu_trainer, g,
                         codegen::cpu::BuildOptions{output, model_hash, "cpu", "", "", sampler})
      .has_value();
}

}  // namespace

std::optional<std::filesystem::path> cached_trainer(const ir::Graph& g, const std::string& target,
                                                    const std::string& hash, std::ostream& log,
                                                    const ir::Graph* sampler) {
  const std::string model_hash = hash.empty() ? tools::model_hash(g) : hash;
  const char* what = g.find_output("loss") != ir::kNoValue ? "trainer" : "sampler";  // an inference program's
  if (target != "cpu") sampler = nullptr;  // CUDA trainers carry none yet
  std::filesystem::path dir = trainer_cache_dir() / cache_key(g, target, model_hash, sampler);
  std::filesystem::path trainer = dir / "trainer";
  std::filesystem::path sum = dir / "trainer.sum";
  bool cached = std::filesystem::exists(trainer);
  if (cached && read_file_bytes(sum.string()) != fnv1a_hex({read_file_bytes(trainer.string())})) {
    // Rebuilt into a temp file and renamed over it: a run that is about to
    // exec the old path never finds it missing.
    log << fmt::format("napkin: the cached {} {} is damaged; rebuilding it\n", what, trainer.string());
    cached = false;
  }
  if (cached) {
    log << fmt::format("napkin: using the cached {} {}\n", what, trainer.string());
    return trainer;
  }
  std::filesystem::create_directories(dir);
  std::string tmp = (dir / fmt::format("trainer.tmp.{}", getpid())).string();
  auto t0 = std::chrono::steady_clock::now();
  if (!build_into(g, target, model_hash, sampler, tmp)) return std::nullopt;
  // The sum goes in place before the trainer, so whoever sees the new
  // trainer also sees its sum.
  std::string sum_tmp = (dir / fmt::format("trainer.sum.tmp.{}", getpid())).string();
  std::ofstream sum_out(sum_tmp, std::ios::binary | std::ios::trunc);
  sum_out << fnv1a_hex({read_file_bytes(tmp)});
  sum_out.close();
  if (!sum_out) {
    std::cerr << fmt::format("error: {}: cannot write the trainer cache\n", sum_tmp);
    return std::nullopt;
  }
  std::filesystem::rename(sum_tmp, sum);
  std::filesystem::rename(tmp, trainer);
  log << fmt::format("napkin: built {} in {:.2f} s (cached at {})\n", g.name,
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), trainer.string());
  return trainer;
}

}  // namespace napkin::tools
