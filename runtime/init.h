// Parameter initialization from a model's init specs, the same numbers on
// every backend: each parameter draws from Rng(seed, stream_for_name(name))
// in row-major order (runtime/rng.h), so its values depend only on (seed,
// name). The reference interpreter (interp/inputs.cpp) calls this too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace napkin::runtime {

// Constant (value), Normal (mean 0, std), or TruncNormal (mean 0, std,
// resampled into [lo, hi]; xavier is one); named in the program's JSON as
// "zeros", "ones", "constant", "normal", "trunc_normal" (runtime/program.cpp).
enum class InitKind : uint8_t { Zeros, Ones, Constant, Normal, TruncNormal };

struct ParamInit {
  InitKind kind = InitKind::Zeros;
  double value = 0, std = 0, lo = 0, hi = 0;
  bool operator==(const ParamInit&) const = default;
};

class ThreadPool;

// The exact double samples (a trainer rounds them to the parameter's dtype).
// With a pool, "normal" draws in parallel: element i is the stream's i-th
// normal, one Philox block each, so the bits do not depend on the split
// (trunc_normal's rejections make it sequential).
std::vector<double> init_values(const ParamInit& init, const std::string& name, int64_t numel, uint64_t seed,
                                ThreadPool* pool = nullptr);

}  // namespace napkin::runtime
