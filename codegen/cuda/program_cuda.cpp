#include "codegen/cuda/program_cuda.h"

#include "codegen/cuda/emit.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cuda {

std::string cuda_program_json(const ir::Graph& g, const KernelPlan& plan, const CudaSource& source,
                              const ProgramFacts& facts, const CudaProgramFacts& cuda) {
  NAPKIN_INTERNAL_CHECK(facts.backend == "cuda", "a CUDA program with backend '{}'", facts.backend);
  NAPKIN_INTERNAL_CHECK(source.launches.size() == plan.kernels.size(), "{} kernels' launches for {} plan kernels",
                        source.launches.size(), plan.kernels.size());
  // The CUDA runtime ignores extent and parallel: launches say how to run a kernel. A batch that can run some
  // of its members only lists them, with their element counts as their work (runtime/optimizer_shards.h).
  std::vector<Launch> launches(plan.kernels.size(), Launch{1, false});
  for (size_t i = 0; i < plan.kernels.size(); ++i)
    if (detail::runs_members_apart(plan.kernels[i]))
      for (const BatchMember& m : plan.kernels[i].batch) launches[i].member_work.push_back(m.numel);
  runtime::Program program = describe_program(g, plan, launches, facts);
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    runtime::KernelSpec& k = program.kernels[i];
    const bool is_matmul = k.as<runtime::MatmulSpec>() != nullptr;
    NAPKIN_INTERNAL_CHECK(is_matmul == source.launches[i].empty(), "kernel {} ({}) has {} CUDA launches", i, k.name,
                          source.launches[i].size());
    k.cuda_launches = source.launches[i];
    if (auto* classifier = std::get_if<runtime::ClassifierSpec>(&k.payload)) {
      const CudaClassifierLayout& l = source.classifiers.at(i);
      classifier->cuda = runtime::ClassifierSpec::Cuda{l.chunk, l.chunks, l.logits, l.dx_acc};
    }
  }
  program.cuda = {cuda.arch, source.scratch_bytes, cuda.tf32};
  return runtime::program_json(program);
}

}  // namespace napkin::codegen::cuda
