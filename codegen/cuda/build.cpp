#include "codegen/cuda/build.h"

#include <chrono>
#include <set>
#include <stdexcept>

#include "analysis/devices.h"
#include "codegen/cuda/kernel_source.h"
#include "codegen/cuda/link_config.h"
#include "codegen/cuda/nvrtc_compile.h"
#include "codegen/cuda/program_cuda.h"
#include "codegen/host/data_object.h"
#include "codegen/host/link.h"

namespace napkin::codegen::cuda {

const char* cuda_runtime_library() { return kCudaRuntimeLibrary; }

CudaBuildResult build_cuda_trainer(const ir::Graph& g, const CudaBuildOptions& options) {
  const analysis::Device* device = analysis::find_device(options.device);
  if (!device)
    throw std::runtime_error("unknown device '" + options.device + "' (known devices: " + analysis::known_device_names() + ")");
  check_arch(options.arch);

  CudaBuildResult result;
  auto t = std::chrono::steady_clock::now();
  auto lap = [&](const std::string& what) {
    auto now = std::chrono::steady_clock::now();
    result.seconds.emplace_back(what, std::chrono::duration<double>(now - t).count());
    t = now;
  };

  KernelPlan plan = plan_kernels(g);
  result.arena_bytes = plan.arena_bytes;
  result.kernels = static_cast<int>(plan.kernels.size());
  for (const Kernel& k : plan.kernels) result.matmul_kernels += k.kind == KernelKind::Gemm;
  lap("kernel plan");

  CudaSourceOptions source_options;
  source_options.classifier_logits_bytes = options.classifier_chunk_bytes;
  CudaSource source = emit_cuda_source(plan, g.name, source_options);
  std::set<std::string> functions;
  for (const auto& launches : source.launches) {
    result.launches += static_cast<int>(launches.size());
    for (const CudaLaunch& l : launches) functions.insert(l.function);
  }
  result.functions = static_cast<int>(functions.size());
  if (!options.emit_cuda.empty()) host::write_file(options.emit_cuda, source.text);
  lap("CUDA C");

  NvrtcResult compiled = nvrtc_compile(source.text, g.name + ".cu", {options.arch, options.line_info, !options.no_cache, ""});
  result.arch = compiled.arch;
  result.nvrtc_version = compiled.nvrtc_version;
  result.cubin_bytes = static_cast<int64_t>(compiled.cubin.size());
  result.ptx_bytes = static_cast<int64_t>(compiled.ptx.size());
  result.nvrtc_seconds = compiled.seconds;
  result.cache_hit = compiled.cache_hit;
  lap(compiled.cache_hit ? "NVRTC (cache hit)" : "NVRTC");

  ProgramFacts facts = step_facts(g, options.device, options.model_hash, "cuda", options.tf32);
  std::string json = cuda_program_json(g, plan, source, facts, {compiled.arch, options.tf32});
  if (!options.emit_program.empty()) host::write_file(options.emit_program, json);
  lap("program");

  std::string object = host::emit_data_object({{"napkin_program_json", std::move(json)},
                                               {"napkin_cuda_cubin", std::move(compiled.cubin)},
                                               {"napkin_cuda_ptx", std::move(compiled.ptx)}},
                                              g.name);
  lap("object");

  // --as-needed: the runtime's link flags name oneDNN for the CPU GEMM,
  // which a CUDA trainer does not use; the GPU machine need not have it.
  host::link_executable(object,
                        std::string(kCudaTrainerMainObject) + " " + kCudaRuntimeLibrary + " " + kRuntimeLibrary +
                            " -Wl,--as-needed " + kRuntimeLinkFlags,
                        options.output);
  lap("link");
  return result;
}

}  // namespace napkin::codegen::cuda
