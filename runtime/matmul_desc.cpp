#include "runtime/matmul_desc.h"

#include <sstream>

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

}  // namespace napkin::runtime
