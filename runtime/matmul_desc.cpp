#include "runtime/matmul_desc.h"

#include <sstream>

#include "runtime/error.h"

namespace napkin::runtime {

namespace {

std::string dims_str(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + ")";
}

}  // namespace

MatmulDesc MatmulDesc::plain(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b) {
  MatmulDesc d;
  d.m = m, d.n = n, d.k = k;
  if (trans_a) d.a_m_stride = 1, d.a_k_stride = m;
  else d.a_m_stride = k, d.a_k_stride = 1;
  if (trans_b) d.b_k_stride = 1, d.b_n_stride = k;
  else d.b_k_stride = n, d.b_n_stride = 1;
  d.c_m_stride = n;
  return d;
}

std::string MatmulDesc::to_string() const {
  std::ostringstream os;
  if (!batch.empty())
    os << "batch" << dims_str(batch) << " a" << dims_str(a_batch_stride) << " b" << dims_str(b_batch_stride) << " c"
       << dims_str(c_batch_stride) << " ";
  os << "m=" << m << " n=" << n << " k=" << k << " a(m " << a_m_stride << ", k " << a_k_stride << ") b(k "
     << b_k_stride << ", n " << b_n_stride << ") c(m " << c_m_stride << ")";
  return os.str();
}

void MatmulDesc::check_sizes() const {
  auto fail = [&](const std::string& what) { throw Error("matmul " + to_string() + ": " + what); };
  size_t nb = batch.size();
  if (a_batch_stride.size() != nb || b_batch_stride.size() != nb || c_batch_stride.size() != nb)
    fail("need one a, b and c batch stride per batch dim");
  if (m < 0 || n < 0 || k < 0) fail("negative size");
  for (int64_t size : batch)
    if (size < 0) fail("negative batch size");
}

std::vector<MatmulDesc::BatchDim> MatmulDesc::merged_batch() const {
  std::vector<BatchDim> dims;
  for (size_t i = 0; i < batch.size(); ++i) {
    BatchDim x{batch[i], a_batch_stride[i], b_batch_stride[i], c_batch_stride[i]};
    if (x.size == 1) continue;
    if (!dims.empty() && dims.back().a == x.a * x.size && dims.back().b == x.b * x.size &&
        dims.back().c == x.c * x.size) {
      dims.back() = {dims.back().size * x.size, x.a, x.b, x.c};
      continue;
    }
    dims.push_back(x);
  }
  return dims;
}

}  // namespace napkin::runtime
