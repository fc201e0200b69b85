// One element of an elementwise op in LLVM IR, in compute types (see
// loop_emitter.h): the formulas of ir/elementwise_formulas.h on LLVM
// primitives chosen so the loop vectorizer can turn them into AVX-512: no
// calls except exp, log, sin, cos and pow, which LLVM maps to glibc's vector
// math library (libmvec), and erf (exact gelu); tanh is built from exp.
#pragma once

#include <llvm/IR/Value.h>

#include <vector>

#include "codegen/cpu/loop_emitter.h"

namespace napkin::codegen::cpu {

// Where an element is, as its op table row's element_index (ir/loop.h) says
// its op needs it (i64 values; nullptr where the op needs none): row and col, its indices
// in the last two dims (triu, causal_mask); flat, its row-major index in the
// output (dropout).
struct ElementAt {
  llvm::Value* row = nullptr;
  llvm::Value* col = nullptr;
  llvm::Value* flat = nullptr;
};

// One output element of elementwise op `op` (attributes `attrs`) given its
// input elements `args` (compute values in each input's dtype; `from` is the
// first input's dtype, `to` the result's: cast converts between them) and
// its position `at`. Both the one-op kernels and the fused kernels
// (codegen/cpu/kernels.cpp) compute through here.
llvm::Value* emit_elementwise(LoopEmitter& e, ir::Op op, const ir::Attrs& attrs, ir::DType from, ir::DType to,
                              const std::vector<llvm::Value*>& args, const ElementAt& at);

// Building blocks the normalization kernels share.
llvm::Value* emit_exp(LoopEmitter& e, llvm::Value* x);
llvm::Value* emit_log(LoopEmitter& e, llvm::Value* x);
llvm::Value* emit_tanh(LoopEmitter& e, llvm::Value* x);

}  // namespace napkin::codegen::cpu
