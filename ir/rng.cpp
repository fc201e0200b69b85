#include "ir/rng.h"

#include <cmath>

#include "ir/internal_check.h"

namespace napkin::ir {

std::vector<ValueId> rng_words(Builder& b) {
  Graph& g = b.graph();
  if (g.rng == kNoValue) {
    TensorType t;
    t.dtype = DType::I64;
    t.dims.push_back({kNumRngWords, ""});
    g.add_rng(t, b.loc());
  }
  // The cached views, unless a pass erased them (a dead-code pass drops views no op reads).
  bool live = static_cast<int64_t>(g.rng_words.size()) == kNumRngWords;
  for (ValueId v : g.rng_words) live = live && !g.node(g.value(v).producer).erased;
  if (!live) {
    g.rng_words.clear();
    for (int64_t w = 0; w < kNumRngWords; ++w)
      g.rng_words.push_back(b.must(b.add(Op::Select, {g.rng}, {{"axis", int64_t{0}}, {"index", w}})));
  }
  return g.rng_words;
}

uint32_t dropout_threshold(double p) {
  NAPKIN_INTERNAL_CHECK(p >= 0 && p < 1, "dropout probability {} outside [0, 1)", p);
  return static_cast<uint32_t>(std::floor(p * 4294967296.0));  // exact: p * 2^32 < 2^32
}

double dropout_scale(double p, DType t) {
  double scale = 1.0 / (1.0 - p);
  return t == DType::F64 ? scale : static_cast<double>(static_cast<float>(scale));
}

}  // namespace napkin::ir
