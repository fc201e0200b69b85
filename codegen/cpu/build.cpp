#include "codegen/cpu/build.h"

#include <llvm/Target/TargetMachine.h>

#include <chrono>
#include <stdexcept>

#include "codegen/cpu/cpu_backend.h"
#include "codegen/cpu/link.h"
#include "codegen/host/link.h"
#include "codegen/host/target_machine.h"
#include "codegen/program_json.h"

namespace napkin::codegen::cpu {

BuildResult build_cpu_trainer(const ir::Graph& g, const BuildOptions& options) {
  BuildResult result;
  auto t = std::chrono::steady_clock::now();
  auto lap = [&](const char* what) {
    auto now = std::chrono::steady_clock::now();
    result.seconds.emplace_back(what, std::chrono::duration<double>(now - t).count());
    t = now;
  };

  KernelPlan plan = plan_kernels(g);
  result.arena_bytes = plan.arena_bytes;
  result.kernels = static_cast<int>(plan.kernels.size());
  for (const Kernel& k : plan.kernels) result.matmul_kernels += k.kind == KernelKind::Gemm;
  lap("kernel plan");

  CpuModule m = emit_module(plan, g.name);
  result.functions = static_cast<int>(m.bodies.size());
  lap("LLVM IR");

  ProgramFacts facts = step_facts(g, options.device, options.model_hash, "cpu");
  std::string json = program_json(g, plan, m.loops, facts);
  add_program_json(m, json);
  if (options.sampler) {  // the same model's checkpoints: the same hash
    KernelPlan sampler_plan = plan_kernels(*options.sampler);
    std::vector<LoopInfo> loops = add_program(m, sampler_plan, "napkin_sampler");
    add_program_json(m, program_json(*options.sampler, sampler_plan, loops,
                                     step_facts(*options.sampler, options.device, options.model_hash, "cpu")),
                     "napkin_sampler");
  }
  if (!options.emit_program.empty()) host::write_file(options.emit_program, json);
  lap("program");

  std::unique_ptr<llvm::TargetMachine> tm = host::host_target_machine();
  optimize(m, *tm);
  if (!options.emit_llvm.empty()) host::write_file(options.emit_llvm, module_text(m));
  lap("LLVM O3");
  std::string object = emit_object(m, *tm);
  lap("machine code");
  link_trainer(object, options.output);
  lap("link");
  return result;
}

}  // namespace napkin::codegen::cpu
