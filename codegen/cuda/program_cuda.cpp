#include "codegen/cuda/program_cuda.h"

#include <nlohmann/json.hpp>

#include "ir/internal_check.h"

namespace napkin::codegen::cuda {

std::string cuda_program_json(const ir::Graph& g, const KernelPlan& plan, const CudaSource& source,
                              const ProgramFacts& facts, const CudaProgramFacts& cuda) {
  NAPKIN_INTERNAL_CHECK(facts.backend == "cuda", "a CUDA program with backend '{}'", facts.backend);
  NAPKIN_INTERNAL_CHECK(source.launches.size() == plan.kernels.size(), "{} kernels' launches for {} plan kernels",
                        source.launches.size(), plan.kernels.size());
  // The CUDA runtime ignores extent and parallel: launches say how to run a kernel.
  std::vector<Launch> cpu_launches(plan.kernels.size(), Launch{1, false});
  nlohmann::json program = nlohmann::json::parse(program_json(g, plan, cpu_launches, facts));
  nlohmann::json& kernels = program.at("kernels");
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const std::vector<CudaLaunch>& launches = source.launches[i];
    bool is_matmul = plan.kernels[i].kind == KernelKind::Gemm;
    NAPKIN_INTERNAL_CHECK(is_matmul == launches.empty(), "kernel {} ({}) has {} CUDA launches", i,
                          plan.kernels[i].name, launches.size());
    if (is_matmul) continue;
    nlohmann::json list = nlohmann::json::array();
    for (const CudaLaunch& l : launches)
      list.push_back({{"function", l.function},
                      {"grid", l.grid},
                      {"block", l.block},
                      {"shared", l.shared_bytes},
                      {"offsets", l.offsets}});
    kernels.at(i)["cuda_launches"] = std::move(list);
    if (plan.kernels[i].kind == KernelKind::Classifier) {
      const CudaClassifierLayout& l = source.classifiers.at(i);
      kernels.at(i).at("classifier")["cuda"] = {
          {"chunk", l.chunk}, {"chunks", l.chunks}, {"logits", l.logits}, {"dx_acc", l.dx_acc}};
    }
  }
  program["cuda"] = {{"arch", cuda.arch}, {"scratch_bytes", source.scratch_bytes}, {"tf32", cuda.tf32}};
  return program.dump(1);
}

}  // namespace napkin::codegen::cuda
