// The rope op's parameters (rotary position embeddings; the arithmetic is
// runtime/rope.h's) and their attributes. A rope node and an attention node
// that applies rope to its q and k as it loads them (passes/fuse_rope.h)
// carry the same attributes, the attention's under the prefix "rope_".
#pragma once

#include <cstdint>
#include <string>

namespace napkin::ir {

class Attrs;

enum class RopeStyle : uint8_t { Half, Interleaved };  // runtime/rope.h says how each pairs elements

struct RopeParams {
  RopeStyle style = RopeStyle::Half;
  double theta = 10000;
  // Llama 3.1's frequency scaling; factor 0: none.
  double factor = 0, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_context = 8192;
  // The rope op's own: the rotated axis and the axis whose index is the
  // position (both non-negative), whether a positions operand gives the
  // positions instead, and whether it rotates by the negated angles (the VJP).
  int64_t axis = 0, seq_axis = 0;
  bool explicit_positions = false;
  bool inverse = false;
  bool operator==(const RopeParams&) const = default;
};

// Reads and writes the attributes; prefix "" on a rope node, "rope_" on an
// attention, attention_grad or cached_attention node.
RopeParams rope_params(const Attrs& a, const std::string& prefix = "");
void set_rope_attrs(Attrs& a, const RopeParams& p, const std::string& prefix = "");
bool has_rope(const Attrs& a, const std::string& prefix = "rope_");

}  // namespace napkin::ir
