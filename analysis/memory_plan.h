// The memory plan of a training step: which buffer reuses another's memory in
// place, and the offset of every buffer in one arena that a backend allocates
// once and never frees. analyze_memory (analysis/memory.h) says which buffers
// exist, which reuse another's memory in place (analysis/in_place_reuse.h)
// and when each is live; this file places the buffers.
// docs/memory-planning.md has the measurements.
//
// Terms:
//  - chain: a buffer that reuses none, and the buffers that take over its
//    memory one after the other. A chain is placed as one item: its size is
//    the (equal) buffer size, its range the union of its members' ranges.
//  - slot: [offset, offset + size) of the arena, size = the buffer's bytes
//    rounded up to kArenaAlignment, so every buffer starts 64-byte aligned
//    (one AVX-512 vector, one cache line).
//  - two chains conflict when their live ranges intersect; resident buffers
//    (params, state, inputs) conflict with everything. Conflicting chains get
//    disjoint slots; chains never live together may share bytes.
//  - placement: residents first (together at the start of the arena), then the
//    largest first (ties: earlier first position, then value id). Each takes a
//    gap between the slots already placed that conflict with it:
//      lowest fit: the lowest offset where it fits;
//      best fit:   the smallest gap where it fits (ties: the lowest), else the
//                  top of the conflicting slots.
//    kPlacement (lowest fit) is the one the plan uses: on every model of
//    models/ it is as good as best fit or better (gpt: 356 bytes over the
//    liveness peak, best fit 264,548); docs/memory-planning.md has the table.
//  - arena_bytes: the end of the highest slot. It is at least the liveness
//    peak (MemoryReport::peak, the lower bound no placement can beat) plus
//    alignment padding; the report prints both.
//  - storage_offset maps every owning value that the step reads or writes to
//    its byte offset: a buffer that reuses another maps to that one's offset,
//    an update's new value written in place (MemoryUpdate::in_place with a
//    storage that is not resident) to its target's. A view's elements are at
//    storage_offset[its storage] + dtype size · (Layout::offset + index · strides).
#pragma once

#include <cstdint>
#include <map>

#include "analysis/memory.h"
#include "ir/graph.h"

namespace napkin::analysis {

inline constexpr int64_t kArenaAlignment = 64;

enum class Placement : uint8_t { LowestFit, BestFit };
inline constexpr Placement kPlacement = Placement::LowestFit;

struct MemoryPlan {
  int64_t arena_bytes = 0;
  int64_t liveness_peak = 0;  // MemoryReport::peak.bytes, for comparison
  // Buffers that take over another's memory in place, and their bytes.
  int in_place_buffers = 0;
  int64_t in_place_bytes = 0;
  std::map<ir::ValueId, int64_t> storage_offset;
  // Whether a value's buffer is in the plan (every owning value the schedule,
  // the outputs or the updates touch).
  bool has(ir::ValueId storage) const { return storage_offset.count(storage) != 0; }
  // Byte offset of the first element of value v (a view or an owner).
  int64_t offset_of(const ir::Graph& g, ir::ValueId v) const;
};

MemoryPlan plan_memory(const MemoryReport& memory, Placement placement = kPlacement);

// The sum of every buffer's bytes, as if none shared memory (the naive plan).
int64_t naive_bytes(const MemoryReport& memory);

}  // namespace napkin::analysis
