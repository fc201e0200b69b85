#include "runtime/rank_memory.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "runtime/executor.h"
#include "runtime/gradient_stage.h"
#include "runtime/optimizer_shards.h"

namespace napkin::runtime {

namespace {

int64_t released(const std::vector<const TensorSpec*>& tensors) {
  int64_t bytes = 0;
  for (const TensorSpec* t : tensors) bytes += Executor::released_bytes(t->offset, t->bytes);
  return bytes;
}

// A field of /proc/self/status in bytes ("VmRSS:   123456 kB"), 0 where there is none.
int64_t status_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  const std::string key = std::string(field) + ":";
  for (std::string line; std::getline(status, line);)
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + key.size()) * 1024;
  return 0;
}

}  // namespace

RankMemory predict_rank_memory(const Program& program, int stage, int ranks, int rank, int64_t micro_batches,
                               int64_t process) {
  RankMemory m;
  m.rank = rank;
  m.arena = program.arena_bytes;
  m.process = process;
  std::optional<OptimizerShards> shards;
  if (stage >= 1 && ranks > 1) {
    shards.emplace(program, ranks, rank);
    m.others_state = released(shards->others_state());
    if (stage == 3) m.others_params = released(shards->others_params());
  }
  const GradientStage::HostBuffers host = GradientStage::host_buffers(
      program, micro_batches, ranks, rank, stage >= 2 && shards ? &*shards : nullptr, stage == 3);
  m.gradient_stage = host.bytes;
  const int64_t block = (host.all_reduced + ranks - 1) / ranks;
  m.collectives = std::max(ranks == 2 ? block : 2 * block, 2 * host.scattered);
  for (const TensorSpec& t : program.tensors)
    if (t.role == TensorRole::Param) m.scratch = std::max(m.scratch, 2 * t.numel() * static_cast<int64_t>(sizeof(float)));
  return m;
}

RankMemory predict_job_memory(const Program& program, int stage, int ranks, int64_t micro_batches, int64_t process) {
  RankMemory most;
  for (int r = 0; r < ranks; ++r)
    if (RankMemory m = predict_rank_memory(program, stage, ranks, r, micro_batches, process); r == 0 || m.total() > most.total())
      most = m;
  return most;
}

int64_t resident_bytes() { return status_bytes("VmRSS"); }
int64_t peak_resident_bytes() { return status_bytes("VmHWM"); }

}  // namespace napkin::runtime
