#include "codegen/cpu/jit.h"

#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/Support/DynamicLibrary.h>
#include <llvm/Support/Error.h>
#include <llvm/Target/TargetMachine.h>

#include "codegen/host/target_machine.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cpu {

namespace {

template <typename T>
T checked(llvm::Expected<T> v, const char* what) {
  if (!v) {
    std::string message = llvm::toString(v.takeError());
    NAPKIN_INTERNAL_CHECK(false, "{}: {}", what, message);
  }
  return std::move(*v);
}

void checked(llvm::Error e, const char* what) {
  if (e) {
    std::string message = llvm::toString(std::move(e));
    NAPKIN_INTERNAL_CHECK(false, "{}: {}", what, message);
  }
}

}  // namespace

JitModule::JitModule(CpuModule m, const std::map<std::string, void*>& host_symbols) {
  std::unique_ptr<llvm::TargetMachine> tm = host::host_target_machine();
  optimize(m, *tm);
  // The vector math the kernels call (a trainer links -lmvec instead).
  llvm::sys::DynamicLibrary::LoadLibraryPermanently("libmvec.so.1");
  jit_ = checked(llvm::orc::LLJITBuilder().create(), "cannot create the JIT");
  llvm::orc::JITDylib& lib = jit_->getMainJITDylib();
  lib.addGenerator(checked(llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
                               jit_->getDataLayout().getGlobalPrefix()),
                           "cannot search the process for symbols"));
  llvm::orc::SymbolMap symbols;
  for (const auto& [name, address] : host_symbols)
    symbols[jit_->mangleAndIntern(name)] = {llvm::orc::ExecutorAddr::fromPtr(address), llvm::JITSymbolFlags::Exported};
  checked(lib.define(llvm::orc::absoluteSymbols(std::move(symbols))), "cannot define the host symbols");
  m.module->setDataLayout(jit_->getDataLayout());
  checked(jit_->addIRModule(llvm::orc::ThreadSafeModule(std::move(m.module), std::move(m.context))), "cannot add the module");
}

JitModule::~JitModule() = default;

void* JitModule::lookup(const std::string& name) {
  return checked(jit_->lookup(name), "symbol not found in the JIT").toPtr<void*>();
}

}  // namespace napkin::codegen::cpu
