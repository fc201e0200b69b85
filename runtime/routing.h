// The routing kernels of a mixture of experts, as the CPU runtime runs them
// (KernelKind::TopK and MoeSlots, codegen/plan.h; the ops' definitions are
// ir/loop.h's TopKParams and MoeSlotsParams).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/tensor_types.h"
#include "runtime/thread_pool.h"

namespace napkin::runtime {

// top_k over the last axis of x (sizes, any element strides): each row's k
// largest values, descending, ties to the lower index, a NaN above every
// number. values [rows, k] in x's dtype and indices i32 [rows, k] are
// contiguous; a value is copied as stored, so it is exact in every dtype.
// f32, bf16 and f16 compare in f32 (exactly: they widen exactly), f64 in f64.
struct TopKDesc {
  std::vector<int64_t> sizes, x_strides;
  int64_t k = 1;
  bool operator==(const TopKDesc&) const = default;
};
// Throws runtime::Error naming what is wrong with the descriptor or the dtype.
void check_top_k(const TopKDesc& d, DType dtype);
// Rows are split across the pool.
void top_k(const TopKDesc& d, DType dtype, const void* x, void* values, int32_t* indices, ThreadPool& pool);

// moe_slots of `tokens` rows of k expert indices (i32, element strides
// index_strides, one per axis): pos i32 [tokens, k], src i32 [experts,
// capacity] and counts f32 [experts], contiguous, as ir/loop.h defines them.
// One sequential scan, O(tokens * k): the choice-major order makes every
// slot depend on the assignments before it.
struct MoeSlotsDesc {
  int64_t tokens = 1, k = 1, experts = 1, capacity = 1;
  std::vector<int64_t> index_strides{1, 1};
  bool operator==(const MoeSlotsDesc&) const = default;
};
void check_moe_slots(const MoeSlotsDesc& d);
// The first index (in row-major order) outside [0, experts), with nothing
// written; nullopt once all three results are.
std::optional<int64_t> moe_slots(const MoeSlotsDesc& d, const int32_t* indices, int32_t* pos, int32_t* src,
                                 float* counts);

}  // namespace napkin::runtime
