#include "runtime/parameter_collectives.h"

#include <chrono>
#include <cstring>
#include <stdexcept>

#include "runtime/tensor_element.h"
#include "runtime/tensor_types.h"

namespace napkin::runtime {

ParameterCollectives::ParameterCollectives(const OptimizerShards& shards, Communicator& comm, int stage)
    : shards_(shards), comm_(comm), stage_(stage) {}

void ParameterCollectives::operator()(const CollectiveSpec& spec, const char* x, char* y) {
  const int64_t bytes = spec.count * element_bytes(spec.dtype);
  auto copy = [&] { std::memmove(y, x, static_cast<size_t>(bytes)); };
  if (spec.collective == "all_reduce_sum") {
    copy();
    comm_.all_reduce_sum(reinterpret_cast<float*>(y), spec.count);
    return;
  }
  if (stage_ < 3) {  // every rank holds every parameter; the gradient stage reduces
    copy();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  const int owner = shards_.owner(spec.param);
  const bool mine = comm_.rank() == owner;
  Totals* totals = nullptr;
  if (spec.collective == "all_gather") {
    if (mine) copy();
    comm_.broadcast(y, bytes, owner);
    totals = &gathers_;
  } else if (spec.collective == "reduce_scatter") {
    if (spec.dtype == DType::F32) {
      comm_.reduce_sum(reinterpret_cast<const float*>(x), reinterpret_cast<float*>(y), spec.count, owner);
    } else {
      staging_.resize(static_cast<size_t>(spec.count));
      for (int64_t i = 0; i < spec.count; ++i) staging_[static_cast<size_t>(i)] = static_cast<float>(read_element(x, spec.dtype, i));
      comm_.reduce_sum(staging_.data(), staging_.data(), spec.count, owner);
      if (mine)
        for (int64_t i = 0; i < spec.count; ++i) write_element(y, spec.dtype, i, staging_[static_cast<size_t>(i)]);
    }
    totals = &reduces_;
  } else {
    throw std::logic_error("ParameterCollectives: unknown collective " + spec.collective);
  }
  if (!counting_) return;
  ++totals->calls;
  totals->bytes += static_cast<double>(bytes);
  totals->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool gathers_parameters(const Program& program) {
  for (const KernelSpec& k : program.kernels)
    if (const CollectiveSpec* c = k.as<CollectiveSpec>(); c && c->collective == "all_gather") return true;
  return false;
}

}  // namespace napkin::runtime
