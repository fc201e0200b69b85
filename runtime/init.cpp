#include "runtime/init.h"

#include "runtime/error.h"
#include "runtime/rng.h"

namespace napkin::runtime {

std::vector<double> init_values(const ParamInit& init, const std::string& name, int64_t numel, uint64_t seed) {
  std::vector<double> out(static_cast<size_t>(numel));
  if (init.kind == "zeros") return out;
  if (init.kind == "ones" || init.kind == "constant") {
    out.assign(out.size(), init.kind == "ones" ? 1.0 : init.value);
    return out;
  }
  Rng rng(seed, stream_for_name(name));
  if (init.kind == "normal") {
    for (double& x : out) x = init.std * rng.normal();
  } else if (init.kind == "trunc_normal") {
    for (double& x : out) x = rng.trunc_normal(0.0, init.std, init.lo, init.hi);
  } else {
    throw Error("parameter '" + name + "': unknown init '" + init.kind + "'");
  }
  return out;
}

}  // namespace napkin::runtime
