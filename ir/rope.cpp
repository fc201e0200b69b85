// Rope's attributes (ir/rope.h).
#include "ir/rope.h"

#include "ir/attrs.h"

namespace napkin::ir {

RopeParams rope_params(const Attrs& a, const std::string& prefix) {
  RopeParams p;
  p.style = a.get_string(prefix + "style") == "interleaved" ? RopeStyle::Interleaved : RopeStyle::Half;
  p.theta = a.get_double(prefix + "theta");
  p.factor = a.get_double(prefix + "factor");
  p.low_freq_factor = a.get_double(prefix + "low_freq_factor");
  p.high_freq_factor = a.get_double(prefix + "high_freq_factor");
  p.original_context = a.get_int(prefix + "original_context");
  if (a.has(prefix + "axis")) p.axis = a.get_int(prefix + "axis");
  if (a.has(prefix + "seq_axis")) p.seq_axis = a.get_int(prefix + "seq_axis");
  if (a.has(prefix + "explicit_positions")) p.explicit_positions = a.get_int(prefix + "explicit_positions") != 0;
  if (a.has(prefix + "inverse")) p.inverse = a.get_int(prefix + "inverse") != 0;
  return p;
}

void set_rope_attrs(Attrs& a, const RopeParams& p, const std::string& prefix) {
  a.set(prefix + "style", std::string(p.style == RopeStyle::Interleaved ? "interleaved" : "half"));
  a.set(prefix + "theta", p.theta);
  a.set(prefix + "factor", p.factor);
  a.set(prefix + "low_freq_factor", p.low_freq_factor);
  a.set(prefix + "high_freq_factor", p.high_freq_factor);
  a.set(prefix + "original_context", p.original_context);
  if (prefix.empty()) {  // the op's own axes; an attention rotates its operands' last axis by their row
    a.set("axis", p.axis);
    a.set("seq_axis", p.seq_axis);
    a.set("explicit_positions", int64_t{p.explicit_positions});
    a.set("inverse", int64_t{p.inverse});
  }
}

bool has_rope(const Attrs& a, const std::string& prefix) { return a.has(prefix + "theta"); }

}  // namespace napkin::ir
