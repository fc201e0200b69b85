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

// Moves the definitions of `from` (a kernel's body and its globals) into
// `into`, both in one context: its declarations become `into`'s own, and
// names already taken there get a suffix.
llvm::Function* move_body(llvm::Module& from, llvm::Module& into) {
  llvm::Function* body = nullptr;
  for (llvm::Function& f : llvm::make_early_inc_range(from)) {
    if (f.isDeclaration()) {
      f.replaceAllUsesWith(into.getOrInsertFunction(f.getName(), f.getFunctionType(), f.getAttributes()).getCallee());
      continue;
    }
    f.removeFromParent();
    into.getFunctionList().push_back(&f);
    body = &f;
  }
  for (llvm::GlobalVariable& g : llvm::make_early_inc_range(from.globals())) {
    g.removeFromParent();
    into.insertGlobalVariable(&g);
  }
  return body;
}

// Whether the CPU runtime runs kernel `k` itself (runtime/executor.cpp's
// runners: the GEMM library, attention, the classifier, rope, the collectives,
// top_k and moe_slots)
// rather than code generated here; a GEMM's epilogue is generated code the
// runtime calls.
bool runs_in_runtime(const Kernel& k) {
  switch (k.kind) {
    case KernelKind::Attention:
    case KernelKind::Classifier:
    case KernelKind::CachedAttention:
    case KernelKind::Rope:
    case KernelKind::Collective:
    case KernelKind::TopK:
    case KernelKind::MoeSlots: return true;
    case KernelKind::Gemm: return !k.epilogue;
    case KernelKind::Fill:
    case KernelKind::Elementwise:
    case KernelKind::FusedElementwise:
    case KernelKind::Reduction:
    case KernelKind::ContractionLoops:
    case KernelKind::Concat:
    case KernelKind::Gather:
    case KernelKind::ScatterAdd:
    case KernelKind::Rows:
    case KernelKind::Mse: return false;
  }
  NAPKIN_INTERNAL_CHECK(false, "kernel {} has an unknown kind", k.name);
  return false;
}

// The kernels of `plan` into m's module, their table exported as `table`:
// per kernel its code and a constant array of its operands' byte offsets
// (LoopEmitter), which the runtime passes to the code (runtime/executor.h
// KernelCode). The code is emitted into a module of its own, named after
// nothing of the kernel's: that module's text is the code's key, and a
// kernel whose key an earlier kernel's code has shares that code, so it is
// optimized and compiled once however many kernels run it (a transformer's
// layers). Kernels sharing code share its partials buffer: the runtime runs
// one kernel at a time.
std::vector<LoopInfo> add_kernels(CpuModule& m, const KernelPlan& plan, const std::string& table_name) {
  llvm::LLVMContext& ctx = *m.context;
  llvm::IRBuilder<> b(ctx);
  llvm::Type* ptr = b.getPtrTy();
  llvm::Type* i64 = b.getInt64Ty();
  std::vector<LoopInfo> loops;
  llvm::StructType* entry = llvm::StructType::get(ctx, {ptr, ptr});
  llvm::Constant* none = llvm::ConstantStruct::get(entry, {llvm::ConstantPointerNull::get(llvm::PointerType::get(ctx, 0)),
                                                           llvm::ConstantPointerNull::get(llvm::PointerType::get(ctx, 0))});
  std::vector<llvm::Constant*> table;
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const Kernel& k = plan.kernels[i];
    if (runs_in_runtime(k)) {
      loops.emplace_back();  // one call, on one thread
      table.push_back(none);
      continue;
    }
    // A GEMM's epilogue also takes the panel of sums it finishes (runtime/executor.cpp EpilogueFn).
    std::vector<llvm::Type*> params{ptr, i64, i64};
    if (k.epilogue) params.push_back(ptr);
    params.push_back(ptr);  // the operands' byte offsets
    llvm::Module own("kernel", ctx);
    llvm::Function* body =
        llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), params, false), llvm::Function::InternalLinkage, "body", own);
    body->addFnAttr(llvm::Attribute::NoUnwind);
    body->addParamAttr(0, llvm::Attribute::NoCapture);
    for (unsigned p = 3; p < params.size(); ++p) {  // the epilogue's panel, the offsets
      body->addParamAttr(p, llvm::Attribute::NoCapture);
      body->addParamAttr(p, llvm::Attribute::NoAlias);
      body->addParamAttr(p, llvm::Attribute::ReadOnly);
    }
    LoopEmitter e(body, b);
    loops.push_back(emit_kernel(e, k, static_cast<int>(i)));
    e.mark_disjoint_slots();
    std::string key;
    llvm::raw_string_ostream(key) << own;
    auto [shared, fresh] = m.bodies.try_emplace(std::move(key), nullptr);
    if (fresh) {
      body->setName(k.name);
      for (llvm::GlobalVariable& g : own.globals()) g.setName(k.name + "_" + g.getName());
      shared->second = move_body(own, *m.module);
    }
    llvm::Constant* offsets = llvm::ConstantDataArray::get(ctx, llvm::ArrayRef<int64_t>(e.slot_offsets()));
    table.push_back(llvm::ConstantStruct::get(
        entry, {shared->second, new llvm::GlobalVariable(*m.module, offsets->getType(), true, llvm::GlobalValue::InternalLinkage,
                                                         offsets, k.name + "_offsets")}));
  }
  auto* table_type = llvm::ArrayType::get(entry, table.size());
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
