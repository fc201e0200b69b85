// top_k and moe_slots by their definitions (ir/loop.h), written plainly: a
// stable sort of each row, and the slot scan in choice-major order. The
// oracle the runtime's kernels (runtime/routing.h) are checked against.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "interp/kernels.h"

namespace napkin::interp::detail {

std::vector<Data> top_k(const ir::TopKParams& p, const Arg& x) {
  const int64_t n = x.shape.back(), rows = numel(x.shape) / n;
  std::vector<Data> out(2);
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.data.data() + r * n;
    std::iota(order.begin(), order.end(), 0);
    // Descending; a NaN above every number; a stable sort keeps ties in index order.
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return std::isnan(row[a]) ? !std::isnan(row[b]) : row[a] > row[b];
    });
    for (int64_t j = 0; j < p.k; ++j) {
      out[0].push_back(row[order[j]]);
      out[1].push_back(static_cast<double>(order[j]));
    }
  }
  return out;
}

std::vector<Data> moe_slots(const ir::Node& n, const ir::MoeSlotsParams& p, const Arg& indices) {
  const int64_t tokens = indices.shape[0], k = indices.shape[1];
  Data pos(static_cast<size_t>(tokens * k), -1), src(static_cast<size_t>(p.experts * p.capacity), 0),
      counts(static_cast<size_t>(p.experts), 0);
  for (double e : indices.data) counts[checked_id(n, e, p.experts, "expert index")] += 1;
  std::vector<int64_t> filled(static_cast<size_t>(p.experts), 0);
  for (int64_t j = 0; j < k; ++j)  // every token's j-th choice before any token's (j+1)-th
    for (int64_t t = 0; t < tokens; ++t) {
      const auto e = static_cast<int64_t>(indices.data[t * k + j]);
      if (filled[e] == p.capacity) continue;  // dropped
      const int64_t slot = e * p.capacity + filled[e]++;
      pos[t * k + j] = static_cast<double>(slot);
      src[slot] = static_cast<double>(t);
    }
  return {pos, src, counts};
}

}  // namespace napkin::interp::detail
