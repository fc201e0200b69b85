#include "codegen/cpu/cpu_backend.h"

#include <llvm/Analysis/TargetLibraryInfo.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <stdexcept>

#include "codegen/cpu/loop_emitter.h"
#include "codegen/host/target_machine.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cpu {

namespace {

// The kernels of `plan` into m's module, their table exported as `table`.
std::vector<LoopInfo> add_kernels(CpuModule& m, const KernelPlan& plan, const std::string& table_name) {
  llvm::LLVMContext& ctx = *m.context;
  llvm::IRBuilder<> b(ctx);
  llvm::Type* ptr = b.getPtrTy();
  llvm::FunctionType* kernel_type = llvm::FunctionType::get(b.getVoidTy(), {ptr, b.getInt64Ty(), b.getInt64Ty()}, false);
  llvm::FunctionType* epilogue_type =
      llvm::FunctionType::get(b.getVoidTy(), {ptr, b.getInt64Ty(), b.getInt64Ty(), ptr}, false);

  std::vector<LoopInfo> loops;
  std::vector<llvm::Constant*> table;
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const Kernel& k = plan.kernels[i];
    const bool runtime_call = k.kind == KernelKind::Attention || k.kind == KernelKind::Classifier ||
                              k.kind == KernelKind::CachedAttention ||
                              (k.kind == KernelKind::Gemm && !k.epilogue);
    if (runtime_call) {
      loops.push_back({1, false});
      table.push_back(llvm::ConstantPointerNull::get(llvm::PointerType::get(ctx, 0)));
      continue;
    }
    // A GEMM's epilogue also takes the panel of sums it finishes (runtime/executor.cpp EpilogueFn).
    llvm::Function* fn = llvm::Function::Create(k.epilogue ? epilogue_type : kernel_type,
                                                llvm::Function::InternalLinkage, k.name, *m.module);
    fn->addFnAttr(llvm::Attribute::NoUnwind);
    fn->addParamAttr(0, llvm::Attribute::NoCapture);
    if (k.epilogue) {
      fn->addParamAttr(3, llvm::Attribute::NoCapture);
      fn->addParamAttr(3, llvm::Attribute::NoAlias);
      fn->addParamAttr(3, llvm::Attribute::ReadOnly);
    }
    LoopEmitter e(fn, b);
    loops.push_back(emit_kernel(e, k, static_cast<int>(i)));
    table.push_back(fn);
  }
  auto* table_type = llvm::ArrayType::get(ptr, table.size());
  new llvm::GlobalVariable(*m.module, table_type, true, llvm::GlobalValue::ExternalLinkage,
                           llvm::ConstantArray::get(table_type, table), table_name);
  return loops;
}

}  // namespace

CpuModule emit_module(const KernelPlan& plan, const std::string& name) {
  CpuModule m;
  m.context = std::make_unique<llvm::LLVMContext>();
  m.module = std::make_unique<llvm::Module>(name, *m.context);
  m.loops = add_kernels(m, plan, "napkin_kernel_fns");
  return m;
}

std::vector<LoopInfo> add_program(CpuModule& m, const KernelPlan& plan, const std::string& prefix) {
  return add_kernels(m, plan, prefix + "_kernel_fns");
}

void add_program_json(CpuModule& m, const std::string& json) { add_program_json(m, json, "napkin"); }

void add_program_json(CpuModule& m, const std::string& json, const std::string& prefix) {
  llvm::LLVMContext& ctx = *m.context;
  llvm::Constant* data = llvm::ConstantDataArray::getString(ctx, json, /*AddNull=*/true);
  new llvm::GlobalVariable(*m.module, data->getType(), true, llvm::GlobalValue::ExternalLinkage, data,
                           prefix + "_program_json");
  new llvm::GlobalVariable(*m.module, llvm::Type::getInt64Ty(ctx), true, llvm::GlobalValue::ExternalLinkage,
                           llvm::ConstantInt::get(llvm::Type::getInt64Ty(ctx), json.size()), prefix + "_program_json_size");
}

void optimize(CpuModule& m, llvm::TargetMachine& tm) {
  llvm::Module& mod = *m.module;
  mod.setTargetTriple(tm.getTargetTriple().str());
  mod.setDataLayout(tm.createDataLayout());
  std::string errors;
  llvm::raw_string_ostream es(errors);
  NAPKIN_INTERNAL_CHECK(!llvm::verifyModule(mod, &es), "generated LLVM IR does not verify: {}", errors);

  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PipelineTuningOptions tuning;
  tuning.LoopVectorization = true;
  tuning.SLPVectorization = true;
  llvm::PassBuilder pb(&tm, tuning);
  // libmvec: vectorized exp, log, sin, cos, pow (_ZGV* in libmvec.so).
  llvm::TargetLibraryInfoImpl tlii(tm.getTargetTriple());
  tlii.addVectorizableFunctionsFromVecLib(llvm::TargetLibraryInfoImpl::LIBMVEC_X86, tm.getTargetTriple());
  fam.registerPass([&] { return llvm::TargetLibraryAnalysis(tlii); });
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
  mpm.run(mod, mam);
}

std::string emit_object(CpuModule& m, llvm::TargetMachine& tm) { return host::emit_object(*m.module, tm); }

std::string module_text(const CpuModule& m) {
  std::string text;
  llvm::raw_string_ostream os(text);
  m.module->print(os, nullptr);
  return text;
}

}  // namespace napkin::codegen::cpu
