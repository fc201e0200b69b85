// Normalization, losses, embedding and the backward-only rules, each written
// as its textbook formula in double.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "interp/kernels.h"
#include "interp/rounding.h"
#include "runtime/rope.h"

namespace napkin::interp::detail {

namespace {

// Rows of a tensor normalized over its last axis: x is [rows, d].
struct Rows {
  int64_t rows, d;
};
Rows rows_of(const Arg& x) {
  int64_t d = x.shape.empty() ? 1 : x.shape.back();
  return {numel(x.shape) / d, d};
}

double mean_of(const double* p, int64_t d) {
  double s = 0;
  for (int64_t j = 0; j < d; ++j) s += p[j];
  return s / static_cast<double>(d);
}

// 1/sqrt(var + eps) and the mean of one row (mean = 0 when not centered:
// rmsnorm's mean square takes the place of the variance).
struct RowStats {
  double mean, rstd;
};
RowStats row_stats(const double* p, int64_t d, double eps, bool centered) {
  double mean = centered ? mean_of(p, d) : 0.0;
  double ss = 0;
  for (int64_t j = 0; j < d; ++j) ss += (p[j] - mean) * (p[j] - mean);
  return {mean, 1.0 / std::sqrt(ss / static_cast<double>(d) + eps)};
}

}  // namespace

Data softmax(const Arg& x, int64_t axis, bool log) {
  AxisSplit s = split_at(x.shape, axis);
  Data out(x.data.size());
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t i = 0; i < s.inner; ++i) {
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k < s.n; ++k) m = std::max(m, x.data[s.at(o, k, i)]);
      double sum = 0;
      for (int64_t k = 0; k < s.n; ++k) sum += std::exp(x.data[s.at(o, k, i)] - m);
      for (int64_t k = 0; k < s.n; ++k) {
        double z = x.data[s.at(o, k, i)] - m;
        out[s.at(o, k, i)] = log ? z - std::log(sum) : std::exp(z) / sum;
      }
    }
  return out;
}

Data softmax_grad(const Arg& y, const Arg& dy, int64_t axis) {
  AxisSplit s = split_at(y.shape, axis);
  Data out(y.data.size());
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t i = 0; i < s.inner; ++i) {
      double dot = 0;
      for (int64_t k = 0; k < s.n; ++k) dot += dy.data[s.at(o, k, i)] * y.data[s.at(o, k, i)];
      for (int64_t k = 0; k < s.n; ++k) {
        int64_t at = s.at(o, k, i);
        out[at] = y.data[at] * (dy.data[at] - dot);
      }
    }
  return out;
}

Data layernorm(const Arg& x, const Arg& gain, const Arg& bias, double eps) {
  auto [rows, d] = rows_of(x);
  Data out(x.data.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* p = x.data.data() + r * d;
    RowStats st = row_stats(p, d, eps, true);
    for (int64_t j = 0; j < d; ++j) out[r * d + j] = (p[j] - st.mean) * st.rstd * gain.data[j] + bias.data[j];
  }
  return out;
}

Data rmsnorm(const Arg& x, const Arg& gain, double eps) {
  auto [rows, d] = rows_of(x);
  Data out(x.data.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* p = x.data.data() + r * d;
    RowStats st = row_stats(p, d, eps, false);
    for (int64_t j = 0; j < d; ++j) out[r * d + j] = p[j] * st.rstd * gain.data[j];
  }
  return out;
}

// y = x_hat * g + b, x_hat = (x - mean) * rstd. With g_dy = dy * g:
// dx = rstd * (g_dy - mean(g_dy) - x_hat * mean(g_dy * x_hat)).
Data layernorm_grad(const Arg& x, const Arg& gain, const Arg& dy, double eps) {
  auto [rows, d] = rows_of(x);
  Data out(x.data.size());
  std::vector<double> xhat(d), gdy(d);
  for (int64_t r = 0; r < rows; ++r) {
    const double* p = x.data.data() + r * d;
    RowStats st = row_stats(p, d, eps, true);
    double mean_gdy = 0, mean_gdy_xhat = 0;
    for (int64_t j = 0; j < d; ++j) {
      xhat[j] = (p[j] - st.mean) * st.rstd;
      gdy[j] = dy.data[r * d + j] * gain.data[j];
      mean_gdy += gdy[j];
      mean_gdy_xhat += gdy[j] * xhat[j];
    }
    mean_gdy /= static_cast<double>(d);
    mean_gdy_xhat /= static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) out[r * d + j] = st.rstd * (gdy[j] - mean_gdy - xhat[j] * mean_gdy_xhat);
  }
  return out;
}

// y = x * rstd * g, rstd = (mean(x^2) + eps)^-1/2. With g_dy = dy * g:
// dx = rstd * (g_dy - x * rstd^2 * mean(g_dy * x)).
Data rmsnorm_grad(const Arg& x, const Arg& gain, const Arg& dy, double eps) {
  auto [rows, d] = rows_of(x);
  Data out(x.data.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* p = x.data.data() + r * d;
    RowStats st = row_stats(p, d, eps, false);
    double mean_gdy_x = 0;
    for (int64_t j = 0; j < d; ++j) mean_gdy_x += dy.data[r * d + j] * gain.data[j] * p[j];
    mean_gdy_x /= static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) {
      double gdy = dy.data[r * d + j] * gain.data[j];
      out[r * d + j] = st.rstd * (gdy - p[j] * st.rstd * st.rstd * mean_gdy_x);
    }
  }
  return out;
}

Data norm_gain_grad(const Arg& x, const Arg& dy, double eps, bool centered) {
  auto [rows, d] = rows_of(x);
  Data out(d, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* p = x.data.data() + r * d;
    RowStats st = row_stats(p, d, eps, centered);
    for (int64_t j = 0; j < d; ++j) out[j] += dy.data[r * d + j] * (p[j] - st.mean) * st.rstd;
  }
  return out;
}

// tanh form: 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi);
// exact form: 0.5 x (1 + erf(x / sqrt 2)) = x Phi(x).
Data cross_entropy(const ir::Node& n, const Arg& logits, const Arg& targets) {
  auto [rows, v] = rows_of(logits);
  Arg row_arg{{rows, v}, logits.dtype, logits.data};
  Data logp = softmax(row_arg, 1, true);
  double loss = 0;
  for (int64_t r = 0; r < rows; ++r) loss -= logp[r * v + checked_id(n, targets.data[r], v, "target class")];
  return {loss / static_cast<double>(rows)};
}

Data cross_entropy_grad(const ir::Node& n, const Arg& logits, const Arg& targets, const Arg& dloss) {
  auto [rows, v] = rows_of(logits);
  Arg row_arg{{rows, v}, logits.dtype, logits.data};
  Data out = softmax(row_arg, 1, false);
  for (int64_t r = 0; r < rows; ++r) out[r * v + checked_id(n, targets.data[r], v, "target class")] -= 1.0;
  double scale = dloss.data[0] / static_cast<double>(rows);
  for (double& g : out) g *= scale;
  return out;
}

Data mse(const Arg& a, const Arg& b) {
  double s = 0;
  for (size_t i = 0; i < a.data.size(); ++i) s += (a.data[i] - b.data[i]) * (a.data[i] - b.data[i]);
  return {s / static_cast<double>(a.data.size())};
}

Data embedding(const ir::Node& n, const Arg& table, const Arg& ids) {
  int64_t vocab = table.shape[0];
  int64_t row = numel(table.shape) / vocab;
  Data out;
  out.reserve(ids.data.size() * row);
  for (double id : ids.data) {
    int64_t k = checked_id(n, id, vocab, "id");
    out.insert(out.end(), table.data.begin() + k * row, table.data.begin() + (k + 1) * row);
  }
  return out;
}

Data embedding_grad(const ir::Node& n, const Arg& dy, const Arg& ids, int64_t vocab, const Arg* base) {
  int64_t count = static_cast<int64_t>(ids.data.size());
  int64_t row = numel(dy.shape) / count;
  Data out = base ? base->data : Data(vocab * row, 0.0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t k = checked_id(n, ids.data[i], vocab, "id");
    for (int64_t j = 0; j < row; ++j) out[k * row + j] += dy.data[i * row + j];
  }
  return out;
}

}  // namespace napkin::interp::detail

namespace napkin::interp::detail {

namespace {

// The dims of attention operands q [B, Hq, T, D], k and v [B, Hk, S, D].
struct AttentionShape {
  int64_t batch, heads, kv_heads, q_len, kv_len, head_dim;
  explicit AttentionShape(const std::vector<Arg>& in)
      : batch(in[0].shape[0]),
        heads(in[0].shape[1]),
        kv_heads(in[1].shape[1]),
        q_len(in[0].shape[2]),
        kv_len(in[1].shape[2]),
        head_dim(in[0].shape[3]) {}
  int64_t q_row(int64_t b, int64_t h, int64_t i) const { return ((b * heads + h) * q_len + i) * head_dim; }
  int64_t kv_row(int64_t b, int64_t h, int64_t j) const {
    return ((b * kv_heads + h / (heads / kv_heads)) * kv_len + j) * head_dim;
  }
  // Keys 0 .. visible(i) - 1 are visible to query i.
  int64_t visible(const ir::AttentionParams& p, int64_t i) const { return p.causal ? i + kv_len - q_len + 1 : kv_len; }
  double dot(const Data& a, int64_t at, const Data& b, int64_t bt) const {
    double s = 0;
    for (int64_t d = 0; d < head_dim; ++d) s += a[at + d] * b[bt + d];
    return s;
  }
};

// x's rows of `dim` elements (x [.., rows, dim], contiguous) rotated as an
// attention's fused rope rotates q or k (ir/loop.h AttentionParams::rope):
// row r of every head at position position(r), r in [0, rows); inverse: by
// the negated angles. In f64, with the runtime's f32 angles (runtime/rope.h).
template <class Position>
Data rotated_rows(const Data& x, int64_t rows, int64_t dim, const ir::RopeParams& p, int64_t positions,
                  bool inverse, Position position) {
  const runtime::RopeDesc d = rope_desc(p, dim);
  const runtime::RopeTable t = runtime::make_rope_table(d, positions);
  Data y = x;
  for (size_t at = 0; at < y.size(); at += static_cast<size_t>(dim)) {
    const int64_t pos = position(static_cast<int64_t>(at / static_cast<size_t>(dim)) % rows);
    runtime::rope_rotate_row(d.style, dim, t.cos_row(pos), t.sin_row(pos), inverse, y.data() + at);
  }
  return y;
}

// q [B, Hq, T, D] and k [B, Hk, S, D] (or dq, dk) rotated by an attention's
// fused rope: query row i at position i + S - T, key row j at j.
Data rotated_q(const AttentionShape& a, const ir::RopeParams& p, const Data& q, bool inverse) {
  return rotated_rows(q, a.q_len, a.head_dim, p, a.kv_len, inverse,
                      [&](int64_t i) { return i + a.kv_len - a.q_len; });
}
Data rotated_k(const AttentionShape& a, const ir::RopeParams& p, const Data& k, bool inverse) {
  return rotated_rows(k, a.kv_len, a.head_dim, p, a.kv_len, inverse, [](int64_t j) { return j; });
}

}  // namespace

std::vector<Data> attention(const ir::AttentionParams& p, const std::vector<Arg>& in) {
  const AttentionShape a(in);
  const Data q = p.rope ? rotated_q(a, *p.rope, in[0].data, false) : in[0].data;
  const Data k = p.rope ? rotated_k(a, *p.rope, in[1].data, false) : in[1].data;
  const Data& v = in[2].data;
  Data o(q.size(), 0.0), lse(static_cast<size_t>(a.batch * a.heads * a.q_len));
  std::vector<double> s(static_cast<size_t>(a.kv_len));
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h)
      for (int64_t i = 0; i < a.q_len; ++i) {
        const int64_t n = a.visible(p, i), qi = a.q_row(b, h, i);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j] = p.scale * a.dot(q, qi, k, a.kv_row(b, h, j)));
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - m);
        const double l = m + std::log(sum);
        lse[(b * a.heads + h) * a.q_len + i] = l;
        for (int64_t j = 0; j < n; ++j) {
          const double pj = std::exp(s[j] - l);
          for (int64_t d = 0; d < a.head_dim; ++d) o[qi + d] += pj * v[a.kv_row(b, h, j) + d];
        }
      }
  if (!p.seq_major_out) return {o, lse};
  Data t(o.size());  // [B, T, Hq, D]
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h)
      for (int64_t i = 0; i < a.q_len; ++i)
        for (int64_t d = 0; d < a.head_dim; ++d)
          t[((b * a.q_len + i) * a.heads + h) * a.head_dim + d] = o[a.q_row(b, h, i) + d];
  return {t, lse};
}

std::vector<Data> cached_attention(const ir::Node& n, const ir::CachedAttentionParams& p, const std::vector<Arg>& in) {
  const int64_t batch = in[0].shape[0], heads = in[0].shape[1], rows = in[0].shape[2], head_dim = in[0].shape[3];
  const int64_t kv_heads = in[1].shape[1], context = in[3].shape[2], group = heads / kv_heads;
  Data kc = in[3].data, vc = in[4].data;
  const Data &v = in[2].data, &pos = in[5].data;
  for (int64_t i = 0; i < rows; ++i)
    if (pos[i] < 0 || pos[i] >= static_cast<double>(context))
      fail(n, fmt::format("position {} of row {} is outside the cache's {} rows", pos[i], i, context));
  // A fused rope: q and the new k rotated at their rows' positions (the cache holds rotated keys).
  auto row_position = [&](int64_t i) { return static_cast<int64_t>(pos[i]); };
  const Data q = p.rope ? rotated_rows(in[0].data, rows, head_dim, *p.rope, context, false, row_position) : in[0].data;
  const Data k = p.rope ? rotated_rows(in[1].data, rows, head_dim, *p.rope, context, false, row_position) : in[1].data;
  auto cache_row = [&](int64_t b, int64_t h, int64_t j) { return ((b * kv_heads + h) * context + j) * head_dim; };
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t d = 0; d < head_dim; ++d) {
          const int64_t from = ((b * kv_heads + h) * rows + i) * head_dim + d;
          kc[cache_row(b, h, static_cast<int64_t>(pos[i])) + d] = k[from];
          vc[cache_row(b, h, static_cast<int64_t>(pos[i])) + d] = v[from];
        }
  Data o(q.size(), 0.0);
  std::vector<double> s(static_cast<size_t>(context));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t visible = static_cast<int64_t>(pos[i]) + 1, qi = ((b * heads + h) * rows + i) * head_dim;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < head_dim; ++d) dot += q[qi + d] * kc[cache_row(b, h / group, j) + d];
          m = std::max(m, s[j] = p.scale * dot);
        }
        double sum = 0;
        for (int64_t j = 0; j < visible; ++j) sum += std::exp(s[j] - m);
        for (int64_t j = 0; j < visible; ++j) {
          const double pj = std::exp(s[j] - m) / sum;
          for (int64_t d = 0; d < head_dim; ++d) o[qi + d] += pj * vc[cache_row(b, h / group, j) + d];
        }
      }
  return {o, kc, vc};
}

std::vector<Data> attention_grad(const ir::AttentionParams& p, const std::vector<Arg>& in) {
  const AttentionShape a(in);
  const Data q = p.rope ? rotated_q(a, *p.rope, in[0].data, false) : in[0].data;
  const Data k = p.rope ? rotated_k(a, *p.rope, in[1].data, false) : in[1].data;
  const Data &v = in[2].data, &o = in[3].data, &lse = in[4].data, &dout = in[5].data;
  Data dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h)
      for (int64_t i = 0; i < a.q_len; ++i) {
        const int64_t n = a.visible(p, i), qi = a.q_row(b, h, i);
        const double l = lse[(b * a.heads + h) * a.q_len + i];
        const double D = a.dot(dout, qi, o, qi);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t kj = a.kv_row(b, h, j);
          const double pij = std::exp(p.scale * a.dot(q, qi, k, kj) - l);
          const double ds = pij * (a.dot(dout, qi, v, kj) - D);
          for (int64_t d = 0; d < a.head_dim; ++d) {
            dq[qi + d] += p.scale * ds * k[kj + d];
            dk[kj + d] += p.scale * ds * q[qi + d];
            dv[kj + d] += pij * dout[qi + d];
          }
        }
      }
  if (p.rope) {  // the gradients of the unrotated q and k
    dq = rotated_q(a, *p.rope, dq, true);
    dk = rotated_k(a, *p.rope, dk, true);
  }
  if (!p.packed_grad) return {dq, dk, dv};
  Data g(3 * dq.size());  // [B, T, 3, H, D]
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h)
      for (int64_t i = 0; i < a.q_len; ++i)
        for (int64_t d = 0; d < a.head_dim; ++d) {
          const int64_t at = (((b * a.q_len + i) * 3) * a.heads + h) * a.head_dim + d, from = a.q_row(b, h, i) + d;
          g[at] = dq[from];
          g[at + a.heads * a.head_dim] = dk[from];
          g[at + 2 * a.heads * a.head_dim] = dv[from];
        }
  return {g};
}

}  // namespace napkin::interp::detail

namespace napkin::interp::detail {

namespace {

// x [rows, d] and w [V, d] of a classifier node, and the logits l = round(x wᵀ).
struct Classifier {
  int64_t rows, vocab, d;
  Data logits;  // [rows, vocab]
  Classifier(const std::vector<Arg>& in, bool native)
      : rows(numel(in[0].shape) / in[0].shape.back()), vocab(in[1].shape[0]), d(in[0].shape.back()) {
    logits.resize(static_cast<size_t>(rows * vocab));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t v = 0; v < vocab; ++v) {
        double s = 0;
        for (int64_t k = 0; k < d; ++k) s += in[0].data[r * d + k] * in[1].data[v * d + k];
        logits[r * vocab + v] = native ? round_to_dtype(s, in[0].dtype) : s;
      }
  }
  double lse(int64_t r) const {
    const double* l = logits.data() + r * vocab;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < vocab; ++v) m = std::max(m, l[v]);
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(l[v] - m);
    return m + std::log(sum);
  }
};

}  // namespace

std::vector<Data> linear_cross_entropy(const ir::Node& n, const std::vector<Arg>& in, bool native) {
  const Classifier c(in, native);
  Data lse(static_cast<size_t>(c.rows));
  double loss = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    lse[r] = c.lse(r);
    loss += lse[r] - c.logits[r * c.vocab + checked_id(n, in[2].data[r], c.vocab, "target class")];
  }
  return {{loss / static_cast<double>(c.rows)}, lse};
}

std::vector<Data> linear_cross_entropy_grad(const ir::Node& n, const std::vector<Arg>& in, bool native) {
  const Classifier c(in, native);
  const Data &x = in[0].data, &w = in[1].data, &lse = in[3].data;
  const double scale = in[4].data[0] / static_cast<double>(c.rows);
  Data dx(x.size(), 0.0), dw(w.size(), 0.0);
  for (int64_t r = 0; r < c.rows; ++r) {
    const int64_t t = checked_id(n, in[2].data[r], c.vocab, "target class");
    for (int64_t v = 0; v < c.vocab; ++v) {
      double g = (std::exp(c.logits[r * c.vocab + v] - lse[r]) - (v == t ? 1.0 : 0.0)) * scale;
      if (native) g = round_to_dtype(g, in[0].dtype);
      for (int64_t k = 0; k < c.d; ++k) {
        dx[r * c.d + k] += g * w[v * c.d + k];
        dw[v * c.d + k] += g * x[r * c.d + k];
      }
    }
  }
  return {dx, dw};
}

}  // namespace napkin::interp::detail
