#include "runtime/init.h"

#include "runtime/rng.h"
#include "runtime/thread_pool.h"

namespace napkin::runtime {

std::vector<double> init_values(const ParamInit& init, const std::string& name, int64_t numel, uint64_t seed,
                                ThreadPool* pool) {
  std::vector<double> out(static_cast<size_t>(numel));
  if (init.kind == InitKind::Zeros) return out;
  if (init.kind == InitKind::Ones || init.kind == InitKind::Constant) {
    out.assign(out.size(), init.kind == InitKind::Ones ? 1.0 : init.value);
    return out;
  }
  const uint64_t stream = stream_for_name(name);
  if (init.kind == InitKind::Normal) {
    // Box-Muller's log and cos cost tens of ns a draw: GPT-2 124M's weights
    // took 7 s of a trainer's start on one thread.
    auto draw = [&](int64_t begin, int64_t end) {
      Rng r(seed, stream);
      r.seek(static_cast<uint64_t>(begin));
      for (int64_t i = begin; i < end; ++i) out[static_cast<size_t>(i)] = init.std * r.normal();
    };
    if (pool && numel >= (int64_t{1} << 16))
      pool->parallel_for(numel, draw);
    else
      draw(0, numel);
  } else {
    Rng rng(seed, stream);
    for (double& x : out) x = rng.trunc_normal(0.0, init.std, init.lo, init.hi);
  }
  return out;
}

}  // namespace napkin::runtime
