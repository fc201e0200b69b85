// The optimizer kernels of the toy programs the data-parallel unit tests
// build by hand (tests/unit/data_parallel_plan_test.cpp,
// rank_memory_test.cpp), over parameters a..e: kernel 0 shared (the
// learning rate), kernel 1 a batch that can run member by member (a, b, c),
// kernel 2 one kernel for d and e together, kernel 3 serving every
// parameter (a gradient norm).
#pragma once

#include <vector>

#include "runtime/kernel_spec.h"

namespace napkin::testing {

inline std::vector<runtime::KernelSpec> toy_optimizer_kernels() {
  runtime::KernelSpec shared, batch, pair, norm;
  shared.name = "lr";
  batch.name = "batch", batch.shared = false, batch.serves = {"a", "b", "c"};
  runtime::LoopSpec members;
  for (const char* m : {"a", "b", "c"}) members.members.push_back({10, {m}, false});
  batch.payload = members;
  pair.name = "pair", pair.shared = false, pair.serves = {"d", "e"};
  norm.name = "norm", norm.shared = false, norm.serves = {"a", "b", "c", "d", "e"};
  norm.out_offset = 1 << 20;  // its scalar: past every parameter and state (an update's output is in them)
  return {shared, batch, pair, norm};
}

}  // namespace napkin::testing
