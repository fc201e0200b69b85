// The body of every loop kernel of the plan, one emitter per KernelKind.
//
// Each kernel loops over a shape whose dim 0 is its parallel dim: the
// function computes dim-0 indices [begin, end), and the runtime either calls
// it once with [0, extent) or splits that range across its threads. A kernel
// whose dim 0 cannot be split without two threads writing one element (a sum
// over dim 0, the loss, an embedding gradient's scatter) is serial.
#pragma once

#include <cstdint>

#include "codegen/cpu/loop_emitter.h"

namespace napkin::codegen::cpu {

using LoopInfo = Launch;

// Emits kernel k (kernels[index] of the plan) into e's function, ending with ret.
LoopInfo emit_kernel(LoopEmitter& e, const Kernel& k, int index);

}  // namespace napkin::codegen::cpu
