#include "runtime/rank_memory.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/pages.h"
#include "runtime/gradient_stage.h"
#include "runtime/optimizer_shards.h"

namespace napkin::runtime {

namespace {

int64_t released(const std::vector<const TensorSpec*>& tensors) {
  int64_t bytes = 0;
  for (const TensorSpec* t : tensors) bytes += whole_pages(t->offset, t->bytes).bytes();
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

// ZeRO-3: the whole pages of the other ranks' gradients that no kernel of
// the step writes. The step's reduce leaves them alone there and
// Engine::zero_gradient gives them back; what the memory plan lets an
// earlier buffer use of their bytes (a kernel's output there) is backed.
int64_t unwritten_gradients(const Program& program, const OptimizerShards& shards, int rank) {
  const int64_t page = page_size();
  std::vector<std::pair<int64_t, int64_t>> given;  // whole pages of the others' gradients
  for (const GradientSpec& g : program.gradients) {
    if (shards.owner(g.param) == rank) continue;
    const int64_t begin = (g.offset + page - 1) / page * page, end = (g.offset + g.bytes) / page * page;
    if (end > begin) given.emplace_back(begin, end);
  }
  std::vector<std::pair<int64_t, int64_t>> written;  // kernel outputs there, out to whole pages
  for (const KernelSpec& k : program.kernels) {
    const CollectiveSpec* c = k.as<CollectiveSpec>();
    if (c && c->collective == "reduce_scatter") continue;  // the others' reduce writes nothing here
    const int64_t bytes = k.out_numel * element_bytes(k.out_dtype);
    if (bytes > 0) written.emplace_back(k.out_offset / page * page, (k.out_offset + bytes + page - 1) / page * page);
  }
  std::sort(written.begin(), written.end());
  int64_t bytes = 0;
  for (const auto& [begin, end] : given) {
    int64_t free_from = begin, covered = 0;
    for (const auto& [wb, we] : written) {
      if (we <= free_from || wb >= end) continue;
      const int64_t from = std::max(free_from, wb), to = std::min(end, we);
      covered += to - from;
      free_from = to;
    }
    bytes += end - begin - covered;
  }
  return bytes;
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
    if (stage == 3) {
      m.others_params = released(shards->others_params());
      m.others_grads = unwritten_gradients(program, *shards, rank);
    }
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
