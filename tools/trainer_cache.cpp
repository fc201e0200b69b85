#include "tools/trainer_cache.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>

#include "analysis/devices.h"
#include "codegen/cpu/build.h"
#include "codegen/cpu/link_config.h"
#include "codegen/host/private_cache.h"
#include "codegen/program_json.h"
#ifdef NAPKIN_HAVE_CUDA
#include "codegen/cuda/build.h"
#endif
#include "ir/printer.h"
#include "tools/files.h"
#include "tools/trainer_build.h"

namespace napkin::tools {

std::filesystem::path trainer_cache_dir() { return codegen::host::user_cache_root(); }

namespace {

std::string cache_key(const ir::Graph& g, const std::string& target, const std::string& model_hash,
                      const ir::Graph* sampler) {
  std::string runtime = read_file_bytes(codegen::cpu::kRuntimeLibrary);
#ifdef NAPKIN_HAVE_CUDA
  if (target == "cuda") runtime += read_file_bytes(codegen::cuda::cuda_runtime_library());
#endif
  // The graph's text, and the training settings it does not show (train.steps
  // sets the default --steps and the schedule's length): editing them builds anew.
  return fnv1a_hex({ir::print_graph(g, {false}), codegen::training_settings_json(g),
                    sampler ? ir::print_graph(*sampler, {false}) : "", target, model_hash,
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
  const std::filesystem::path root = trainer_cache_dir();
  const std::filesystem::path dir = root / cache_key(g, target, model_hash, sampler);
  for (const std::filesystem::path& d : {root, dir})
    if (std::string problem = codegen::host::private_directory_problem(d); !problem.empty()) {
      std::cerr << fmt::format("error: the {} cache {}\n    hint: remove it, or set XDG_CACHE_HOME to a directory of "
                               "your own that only you can write\n",
                               what, problem);
      return std::nullopt;
    }
  std::filesystem::path trainer = dir / "trainer";
  std::filesystem::path sum = dir / "trainer.sum";
  std::error_code ec;
  bool cached = std::filesystem::exists(trainer, ec);
  if (std::string why = cached ? codegen::host::untrusted_entry(trainer) : ""; !why.empty()) {
    log << fmt::format("napkin: the cached {} {} {}; rebuilding it\n", what, trainer.string(), why);
    cached = false;
  } else if (cached && read_file_bytes(sum.string()) != fnv1a_hex({read_file_bytes(trainer.string())})) {
    log << fmt::format("napkin: the cached {} {} is damaged; rebuilding it\n", what, trainer.string());
    cached = false;
  }
  if (cached) {
    log << fmt::format("napkin: using the cached {} {}\n", what, trainer.string());
    return trainer;
  }
  // Rebuilt into a temp file and renamed over it: a run that is about to
  // exec the old path never finds it missing.
  std::string tmp = (dir / fmt::format("trainer.tmp.{}", getpid())).string();
  auto t0 = std::chrono::steady_clock::now();
  if (!build_into(g, target, model_hash, sampler, tmp)) return std::nullopt;
  // The sum goes in place before the trainer, so whoever sees the new
  // trainer also sees its sum.
  std::string sum_tmp = (dir / fmt::format("trainer.sum.tmp.{}", getpid())).string();
  std::ofstream sum_out(sum_tmp, std::ios::binary | std::ios::trunc);
  sum_out << fnv1a_hex({read_file_bytes(tmp)});
  sum_out.close();
  std::string error;
  if (!sum_out) error = "cannot write " + sum_tmp;
  else if (std::filesystem::rename(sum_tmp, sum, ec); ec) error = ec.message();
  else if (std::filesystem::rename(tmp, trainer, ec); ec) error = ec.message();
  if (!error.empty()) {
    std::cerr << fmt::format("error: {}: cannot write the {} cache ({})\n", dir.string(), what, error);
    std::filesystem::remove(sum_tmp, ec);
    std::filesystem::remove(tmp, ec);
    return std::nullopt;
  }
  log << fmt::format("napkin: built {} in {:.2f} s (cached at {})\n", g.name,
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), trainer.string());
  return trainer;
}

}  // namespace napkin::tools
