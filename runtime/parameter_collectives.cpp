#include "runtime/parameter_collectives.h"

#include <chrono>
#include <stdexcept>

#include "runtime/tensor_element.h"
#include "runtime/tensor_types.h"

namespace napkin::runtime {

ParameterCollectives::ParameterCollectives(const OptimizerShards& shards, Communicator& comm, int stage)
    : shards_(shards), comm_(comm), stage_(stage) {}

void ParameterCollectives::operator()(const CollectiveSpec& spec, char* y) {
  if (spec.collective == "all_reduce_sum") {
    comm_.all_reduce_sum(reinterpret_cast<float*>(y), spec.count);
    return;
  }
  if (stage_ < 3) return;  // every rank holds every parameter; the gradient stage reduces
  const auto start = std::chrono::steady_clock::now();
  const int owner = shards_.owner(spec.param);
  const int64_t bytes = spec.count * element_bytes(spec.dtype);
  Totals* totals = nullptr;
  if (spec.collective == "all_gather") {
    comm_.broadcast(y, bytes, owner);
    totals = &gathers_;
  } else if (spec.collective == "reduce_scatter") {
    if (spec.dtype == DType::F32) {
      comm_.reduce_sum(reinterpret_cast<float*>(y), reinterpret_cast<float*>(y), spec.count, owner);
    } else {
      staging_.resize(static_cast<size_t>(spec.count));
      for (int64_t i = 0; i < spec.count; ++i) staging_[static_cast<size_t>(i)] = static_cast<float>(read_element(y, spec.dtype, i));
      comm_.reduce_sum(staging_.data(), staging_.data(), spec.count, owner);
      if (comm_.rank() == owner)
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
