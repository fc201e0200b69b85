#include "runtime/cached_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "runtime/error.h"
#include "runtime/gemm_element.h"

namespace napkin::runtime {

namespace {

int64_t at(const AttentionDesc::Strides& s, int64_t b, int64_t h, int64_t row) {
  return b * s.batch + h * s.head + row * s.row;
}

// o for every (batch, head, row) item in [begin, end): the definition, row by row.
// The head_dim elements of a row of src at element si, rotated at position
// p, into dst at element di (rope: the k rows written into the cache).
template <typename Acc>
void copy_rotated_row(const CachedAttentionDesc& d, const RopeTable& rope, GemmType t, const void* src, int64_t si,
                      int64_t p, void* dst, int64_t di, std::vector<Acc>& row) {
  for (int64_t c = 0; c < d.head_dim; ++c) row[c] = load_element<Acc>(t, src, si + c);
  rope_rotate_row(d.rope->style, d.head_dim, rope.cos_row(p), rope.sin_row(p), false, row.data());
  for (int64_t c = 0; c < d.head_dim; ++c) store_element<Acc>(t, dst, di + c, row[c]);
}

// rope: the table of d.rope or null; q rows are rotated as they are loaded.
template <typename Acc>
void decode_rows(const CachedAttentionDesc& d, const RopeTable* rope, GemmType t, const char* q, const char* kc, const char* vc,
                 const int64_t* pos, char* o, int64_t begin, int64_t end) {
  std::vector<Acc> scores(static_cast<size_t>(d.context)), out(static_cast<size_t>(d.head_dim)), qrow(out.size());
  const int64_t group = d.heads / d.kv_heads;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t i = item % d.rows, h = (item / d.rows) % d.heads, b = item / (d.rows * d.heads);
    const int64_t visible = pos[i] + 1, qi = at(d.q, b, h, i);
    for (int64_t c = 0; c < d.head_dim; ++c) qrow[c] = load_element<Acc>(t, q, qi + c);
    if (rope) rope_rotate_row(d.rope->style, d.head_dim, rope->cos_row(pos[i]), rope->sin_row(pos[i]), false, qrow.data());
    Acc m = -std::numeric_limits<Acc>::infinity();
    for (int64_t j = 0; j < visible; ++j) {
      const int64_t kj = at(d.k_cache, b, h / group, j);
      Acc dot = 0;
      for (int64_t c = 0; c < d.head_dim; ++c) dot += qrow[c] * load_element<Acc>(t, kc, kj + c);
      scores[j] = dot * static_cast<Acc>(d.scale);
      m = std::max(m, scores[j]);
    }
    Acc sum = 0;
    for (int64_t j = 0; j < visible; ++j) sum += scores[j] = std::exp(scores[j] - m);
    std::fill(out.begin(), out.end(), Acc(0));
    for (int64_t j = 0; j < visible; ++j) {
      const int64_t vj = at(d.v_cache, b, h / group, j);
      const Acc p = scores[j];
      for (int64_t c = 0; c < d.head_dim; ++c) out[c] += p * load_element<Acc>(t, vc, vj + c);
    }
    const int64_t oi = at(d.o, b, h, i);
    for (int64_t c = 0; c < d.head_dim; ++c) store_element<Acc>(t, o, oi + c, out[c] / sum);
  }
}

}  // namespace

CachedAttention::CachedAttention(CachedAttentionDesc desc, GemmType type) : d_(desc), type_(type) {
  const CachedAttentionDesc& d = d_;
  if (d.batch < 1 || d.heads < 1 || d.kv_heads < 1 || d.rows < 1 || d.context < 1 || d.head_dim < 1)
    throw Error("cached attention: every size must be at least 1");
  if (d.heads % d.kv_heads != 0) throw Error("cached attention: query heads do not group evenly over kv heads");
  if (d.rows > d.context) throw Error("cached attention: more new rows than the cache holds");
  if (d.rope) {
    if (d.rope->dim != d.head_dim || d.head_dim % 2 != 0)
      throw Error("cached attention: rope rotates " + std::to_string(d.rope->dim) + " elements of a row, head_dim is " +
                  std::to_string(d.head_dim) + " (they must be equal and even)");
    rope_ = make_rope_table(*d.rope, d.context);
  }
  if (d.rows > 1) {  // a prefill: causal attention over the new rows (the caches' first `rows` rows then)
    AttentionDesc a;
    a.batch = d.batch;
    a.heads = d.heads;
    a.kv_heads = d.kv_heads;
    a.q_len = a.kv_len = d.rows;
    a.head_dim = d.head_dim;
    a.causal = true;
    a.scale = d.scale;
    a.q = d.q;
    a.k = d.k;
    a.v = d.v;
    a.o = d.o;
    a.rope = d.rope;
    prefill_ = std::make_unique<Attention>(a, type);
    prefill_lse_.resize(static_cast<size_t>(d.batch * d.heads * d.rows));
  }
}

CachedAttention::~CachedAttention() = default;
CachedAttention::CachedAttention(CachedAttention&&) noexcept = default;

void CachedAttention::run(const void* q, const void* k, const void* v, void* k_cache, void* v_cache,
                          const void* positions, void* o, ThreadPool& pool) const {
  const CachedAttentionDesc& d = d_;
  std::vector<int64_t> pos(static_cast<size_t>(d.rows));
  bool prefix = true;  // positions 0, 1, ..., rows - 1
  for (int64_t i = 0; i < d.rows; ++i) {
    pos[i] = d.positions_i64 ? static_cast<const int64_t*>(positions)[i] : static_cast<const int32_t*>(positions)[i];
    if (pos[i] < 0 || pos[i] >= d.context)
      throw Error("cached attention: position " + std::to_string(pos[i]) + " of row " + std::to_string(i) +
                  " is outside the cache's " + std::to_string(d.context) + " rows");
    prefix = prefix && pos[i] == i;
  }
  const size_t row_bytes = static_cast<size_t>(d.head_dim) * gemm_type_bytes(type_);
  const size_t elem = gemm_type_bytes(type_);
  auto* kc = static_cast<char*>(k_cache);
  auto* vc = static_cast<char*>(v_cache);
  std::vector<double> row(static_cast<size_t>(d.head_dim));
  std::vector<float> row32(row.size());
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.kv_heads; ++h)
      for (int64_t i = 0; i < d.rows; ++i) {
        if (!rope_)
          std::memcpy(kc + at(d.k_cache, b, h, pos[i]) * elem, static_cast<const char*>(k) + at(d.k, b, h, i) * elem,
                      row_bytes);
        else if (type_ == GemmType::F64)
          copy_rotated_row(d, *rope_, type_, k, at(d.k, b, h, i), pos[i], k_cache, at(d.k_cache, b, h, pos[i]), row);
        else
          copy_rotated_row(d, *rope_, type_, k, at(d.k, b, h, i), pos[i], k_cache, at(d.k_cache, b, h, pos[i]), row32);
        std::memcpy(vc + at(d.v_cache, b, h, pos[i]) * elem, static_cast<const char*>(v) + at(d.v, b, h, i) * elem,
                    row_bytes);
      }
  if (prefill_ && prefix) {
    prefill_->forward(q, k, v, o, prefill_lse_.data(), pool);
    return;
  }
  const RopeTable* rope = rope_ ? &*rope_ : nullptr;
  const auto* qb = static_cast<const char*>(q);
  auto* ob = static_cast<char*>(o);
  pool.parallel_for(d.batch * d.heads * d.rows, [&](int64_t begin, int64_t end) {
    if (type_ == GemmType::F64)
      decode_rows<double>(d, rope, type_, qb, kc, vc, pos.data(), ob, begin, end);
    else
      decode_rows<float>(d, rope, type_, qb, kc, vc, pos.data(), ob, begin, end);
  });
}

}  // namespace napkin::runtime
