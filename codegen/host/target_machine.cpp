#include "codegen/host/target_machine.h"

#include <llvm/ADT/StringMap.h>
#include <llvm/Analysis/TargetLibraryInfo.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/TargetParser/Host.h>

#include <mutex>
#include <stdexcept>
#include <string>

#include "ir/internal_check.h"

namespace napkin::codegen::host {

std::unique_ptr<llvm::TargetMachine> host_target_machine() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
  std::string triple = llvm::sys::getDefaultTargetTriple();
  std::string error;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(triple, error);
  if (!target) throw std::runtime_error("LLVM has no target for " + triple + ": " + error);
  std::string features;
  for (const auto& f : llvm::sys::getHostCPUFeatures()) features += (f.second ? "+" : "-") + f.first().str() + ",";
  llvm::TargetOptions options;
  std::unique_ptr<llvm::TargetMachine> tm(target->createTargetMachine(
      triple, llvm::sys::getHostCPUName(), features, options, llvm::Reloc::PIC_, std::nullopt, llvm::CodeGenOptLevel::Aggressive));
  return tm;
}

std::string emit_object(llvm::Module& module, llvm::TargetMachine& tm) {
  llvm::SmallVector<char, 0> buffer;
  llvm::raw_svector_ostream os(buffer);
  llvm::legacy::PassManager pm;
  llvm::TargetLibraryInfoImpl tlii(tm.getTargetTriple());
  pm.add(new llvm::TargetLibraryInfoWrapperPass(tlii));
  NAPKIN_INTERNAL_CHECK(!tm.addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::ObjectFile),
                        "LLVM cannot emit an object file for this target");
  pm.run(module);
  return std::string(buffer.begin(), buffer.end());
}

}  // namespace napkin::codegen::host
