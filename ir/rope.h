// The rope op's parameters (rotary position embeddings; the arithmetic is
// runtime/rope.h's) and their attributes. A rope node and an attention node
// that applies rope to its q and k as it loads them (passes/fuse_rope.h)
// carry the same attributes, the attention's under the prefix "rope_".
// RopeParams itself is a loop kind's parameters, so ir/loop.h defines it.
#pragma once

#include <string>

#include "ir/loop.h"

namespace napkin::ir {

class Attrs;

// Reads and writes the attributes; prefix "" on a rope node, "rope_" on an
// attention, attention_grad or cached_attention node.
RopeParams rope_params(const Attrs& a, const std::string& prefix = "");
void set_rope_attrs(Attrs& a, const RopeParams& p, const std::string& prefix = "");
bool has_rope(const Attrs& a, const std::string& prefix = "rope_");

}  // namespace napkin::ir
