#include "codegen/host/data_object.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/Target/TargetMachine.h>

#include "codegen/host/target_machine.h"

namespace napkin::codegen::host {

std::string emit_data_object(const std::vector<DataSymbol>& symbols, const std::string& module_name) {
  llvm::LLVMContext ctx;
  llvm::Module module(module_name, ctx);
  llvm::Type* i64 = llvm::Type::getInt64Ty(ctx);
  for (const DataSymbol& s : symbols) {
    llvm::Constant* data = llvm::ConstantDataArray::getString(ctx, s.bytes, /*AddNull=*/true);
    auto* bytes = new llvm::GlobalVariable(module, data->getType(), true, llvm::GlobalValue::ExternalLinkage, data, s.name);
    // 64: a cubin is an ELF image the CUDA driver reads in place.
    bytes->setAlignment(llvm::Align(64));
    new llvm::GlobalVariable(module, i64, true, llvm::GlobalValue::ExternalLinkage,
                             llvm::ConstantInt::get(i64, s.bytes.size()), s.name + "_size");
  }
  std::unique_ptr<llvm::TargetMachine> tm = host_target_machine();
  module.setTargetTriple(tm->getTargetTriple().str());
  module.setDataLayout(tm->createDataLayout());
  return emit_object(module, *tm);
}

}  // namespace napkin::codegen::host
