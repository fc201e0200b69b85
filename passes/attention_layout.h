// Attention output layout: a fused attention whose output o is copied to
// [batch, seq, heads, head_dim] to merge its heads for the projection after
// it,
//
//   o = attention(q, k, v)             [B, H, T, D]
//   y = copy(permute(o, [0, 2, 1, 3]))  [B, T, H, D]   (then "b s (h hd)")
//
// stores o in that layout itself (attention {seq_major_out=1}; both
// backends' attention kernels write o by strides), the copy's readers read o,
// and the attention's gradient reads o through the permute view, [B, H, T, D]
// again. GPT-2 124M: 12 copy kernels and 0.28 GiB a step less; the same bits.
// Only where the permute view is o's only reader besides attention gradients
// and the copy the view's only reader.
#pragma once

#include <memory>

#include "passes/pass.h"

namespace napkin::passes {

std::unique_ptr<Pass> make_attention_layout_pass();

}  // namespace napkin::passes
