#include "codegen/cpu/data_object.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/Target/TargetMachine.h>

#include "codegen/cpu/cpu_backend.h"

namespace napkin::codegen::cpu {

std::string emit_data_object(const std::vector<DataSymbol>& symbols, const std::string& module_name) {
  CpuModule m;
  m.context = std::make_unique<llvm::LLVMContext>();
  m.module = std::make_unique<llvm::Module>(module_name, *m.context);
  llvm::LLVMContext& ctx = *m.context;
  llvm::Type* i64 = llvm::Type::getInt64Ty(ctx);
  for (const DataSymbol& s : symbols) {
    llvm::Constant* data = llvm::ConstantDataArray::getString(ctx, s.bytes, /*AddNull=*/true);
    auto* bytes = new llvm::GlobalVariable(*m.module, data->getType(), true, llvm::GlobalValue::ExternalLinkage, data, s.name);
    // 64: a cubin is an ELF image the CUDA driver reads in place.
    bytes->setAlignment(llvm::Align(64));
    new llvm::GlobalVariable(*m.module, i64, true, llvm::GlobalValue::ExternalLinkage,
                             llvm::ConstantInt::get(i64, s.bytes.size()), s.name + "_size");
  }
  std::unique_ptr<llvm::TargetMachine> tm = host_target_machine();
  m.module->setTargetTriple(tm->getTargetTriple().str());
  m.module->setDataLayout(tm->createDataLayout());
  return emit_object(m, *tm);
}

}  // namespace napkin::codegen::cpu
