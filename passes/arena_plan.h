// Offsets in one arena for every buffer of a training step: the memory plan a
// backend allocates once and never frees. analyze_memory (passes/memory.h)
// says which buffers exist and when each is live; this file places them.
//
// Terms:
//  - slot: [offset, offset + size) of the arena, size = the buffer's bytes
//    rounded up to kArenaAlignment, so every buffer starts 64-byte aligned
//    (one AVX-512 vector, one cache line).
//  - two buffers conflict when their live ranges (MemoryBuffer::first..last,
//    inclusive schedule positions) intersect; resident buffers (params, state,
//    inputs) conflict with everything. Conflicting buffers get disjoint slots;
//    buffers that are never live together may share bytes.
//  - placement: largest buffer first (ties: earlier first position, then value
//    id); each takes the lowest offset where it fits between the slots already
//    placed that conflict with it. Resident buffers are placed first, so they
//    sit together at the start of the arena.
//  - arena_bytes: the end of the highest slot. It is at least the liveness
//    peak (MemoryReport::peak, the lower bound no placement can beat) plus
//    alignment padding; the report prints both.
//  - storage_offset maps every owning value that the step reads or writes to
//    its byte offset: an update's new value written in place
//    (MemoryUpdate::in_place with a storage that is not resident) maps to its
//    target's offset. A view's elements are at storage_offset[its storage] +
//    dtype size · (Layout::offset + index · strides).
#pragma once

#include <cstdint>
#include <map>

#include "ir/graph.h"
#include "passes/memory.h"

namespace napkin::passes {

inline constexpr int64_t kArenaAlignment = 64;

struct ArenaPlan {
  int64_t arena_bytes = 0;
  int64_t liveness_peak = 0;  // MemoryReport::peak.bytes, for comparison
  std::map<ir::ValueId, int64_t> storage_offset;
  // Whether a value's buffer is in the plan (every owning value the schedule,
  // the outputs or the updates touch).
  bool has(ir::ValueId storage) const { return storage_offset.count(storage) != 0; }
  // Byte offset of the first element of value v (a view or an owner).
  int64_t offset_of(const ir::Graph& g, ir::ValueId v) const;
};

ArenaPlan plan_arena(const MemoryReport& memory);

}  // namespace napkin::passes
