// The program description of a CUDA trainer: the backend-neutral one
// (codegen/program_json.h, backend "cuda") plus the fields only the CUDA
// runtime reads (runtime/program.h, docs/runtime.md):
//   per loop kernel   "cuda_launches": [{"function", "grid", "block", "shared", "offsets"}]
//                     its launches in order, "offsets" the values of the
//                     function's `off` parameter (codegen/cuda/kernel_source.h)
//   classifier kernel "classifier": {..., "cuda": {"chunk", "chunks", "logits", "dx_acc"}}
//                     how its GEMMs split the vocabulary and where their
//                     buffers sit in scratch (CudaClassifierLayout)
//   top level         "cuda": {"arch", "scratch_bytes", "tf32"}
// Added here, to the typed program, so that codegen/program_json knows
// nothing of CUDA.
#pragma once

#include <string>

#include "codegen/cuda/kernel_source.h"
#include "codegen/plan.h"
#include "codegen/program_json.h"
#include "ir/graph.h"

namespace napkin::codegen::cuda {

struct CudaProgramFacts {
  std::string arch;  // the cubin's
  bool tf32 = false;
};

// `facts.backend` must be "cuda"; `source` must be emit_cuda_source(plan).
std::string cuda_program_json(const ir::Graph& g, const KernelPlan& plan, const CudaSource& source,
                              const ProgramFacts& facts, const CudaProgramFacts& cuda);

}  // namespace napkin::codegen::cuda
