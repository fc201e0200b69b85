// runtime/rank_memory.h: a rank's predicted memory, term by term, against hand sums on a program whose
// tensors are whole pages.
#include <doctest/doctest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "runtime/pages.h"
#include "runtime/rank_memory.h"
#include "support/toy_optimizer.h"

namespace napkin {
namespace {

const int64_t kPage = ::sysconf(_SC_PAGESIZE);

// Params a..e of 4, 3, 2, 1 and 1 pages of f32, each with as much optimizer state and an f32 gradient, laid
// out one after the other from offset 0, then 10 pages of activations. The kernels are
// data_parallel_plan_test's: d and e share one, so on 2 ranks rank 0 owns a, d and e, rank 1 b and c.
runtime::Program paged_program() {
  runtime::Program p;
  const std::vector<std::pair<std::string, int64_t>> pages = {{"a", 4}, {"b", 3}, {"c", 2}, {"d", 1}, {"e", 1}};
  int64_t at = 0;
  auto place = [&](runtime::TensorSpec t, int64_t n) {
    t.offset = at, t.bytes = n * kPage, t.dtype = runtime::DType::F32, t.shape = {n * kPage / 4};
    at += t.bytes;
    p.tensors.push_back(t);
  };
  for (const auto& [name, n] : pages) {
    runtime::TensorSpec param;
    param.name = name, param.role = runtime::TensorRole::Param;
    place(param, n);
    runtime::TensorSpec state;
    state.name = "adam.m." + name, state.role = runtime::TensorRole::State, state.param = name;
    place(state, n);
  }
  for (const auto& [name, n] : pages) {
    p.gradients.push_back({name, runtime::DType::F32, at, n * kPage, 0});
    at += n * kPage;
  }
  p.arena_bytes = at + 10 * kPage;
  p.kernels = napkin::testing::toy_optimizer_kernels();
  return p;
}

TEST_CASE("rank memory: the arena less the others' pages, the gradient stage, MPI's blocks and the scratch, by hand") {
  const runtime::Program p = paged_program();
  const int64_t A = p.arena_bytes, G = 11 * kPage, process = 1000;
  const int64_t scratch = 2 * 4 * kPage;  // two of the largest parameter, a
  // One process: the arena, the scratch and the process; no gradient stage without ranks or accumulation.
  const runtime::RankMemory one = runtime::predict_rank_memory(p, 0, 1, 0, 1, process);
  CHECK(one.total() == A + scratch + process);
  // Accumulating 2 micro-batches alone: the f32 sum and a copy of the gradients to add.
  CHECK(runtime::predict_rank_memory(p, 0, 1, 0, 2, process).gradient_stage == 2 * G);

  // 2 ranks, rank 0 owning a, d and e (6 pages), rank 1 b and c (5).
  const runtime::RankMemory plain = runtime::predict_rank_memory(p, 0, 2, 0, 1, process);
  CHECK(plain.gradient_stage == G);    // the whole f32 sum
  CHECK(plain.collectives == G / 2);   // Open MPI's ring all-reduce: one block of B/N on 2 ranks
  CHECK(plain.total() == A + G + G / 2 + scratch + process);
  const runtime::RankMemory zero1 = runtime::predict_rank_memory(p, 1, 2, 0, 1, process);
  CHECK(zero1.others_state == 5 * kPage);  // b's and c's state
  CHECK(zero1.others_params == 0);
  CHECK(zero1.total() == plain.total() - 5 * kPage);
  const runtime::RankMemory zero2 = runtime::predict_rank_memory(p, 2, 2, 0, 1, process);
  CHECK(zero2.gradient_stage == 6 * kPage + G);  // its own sum, and one bucket's staging: every gradient (< 25 MiB)
  CHECK(zero2.collectives == 2 * G);             // the reduce-scatter of that bucket
  const runtime::RankMemory zero3 = runtime::predict_rank_memory(p, 3, 2, 0, 1, process);
  CHECK(zero3.others_params == 5 * kPage);
  CHECK(zero3.others_state == 5 * kPage);
  CHECK(zero3.gradient_stage == 6 * kPage);  // its own sum (the others' gradients are zeroed by giving pages back)
  CHECK(zero3.collectives == 0);
  CHECK(zero3.others_grads == 5 * kPage);  // b's and c's gradients: no kernel of this program writes there
  CHECK(zero3.total() == A - 15 * kPage + 6 * kPage + scratch + process);
  // Rank 1 owns less: the job's figure is rank 0's.
  CHECK(runtime::predict_rank_memory(p, 3, 2, 1, 1, process).total() < zero3.total());
  CHECK(runtime::predict_job_memory(p, 3, 2, 1, process).rank == 0);

  // 4 ranks: two blocks of B/4 in the all-reduce.
  CHECK(runtime::predict_rank_memory(p, 0, 4, 0, 1, process).collectives == 2 * (G / 4));
}

TEST_CASE("rank memory: a released range gives back the whole pages inside it") {
  CHECK(runtime::whole_pages(0, 2 * kPage).bytes() == 2 * kPage);
  CHECK(runtime::whole_pages(100, 2 * kPage).bytes() == kPage);
  CHECK(runtime::whole_pages(0, kPage - 1).bytes() == 0);
  CHECK(runtime::whole_pages(kPage - 1, kPage + 2).bytes() == kPage);
}

}  // namespace
}  // namespace napkin
