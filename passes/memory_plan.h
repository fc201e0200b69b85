// The memory plan of a training step: which buffer reuses another's memory in
// place, and the offset of every buffer in one arena that a backend allocates
// once and never frees. analyze_memory (passes/memory.h) says which buffers
// exist and when each is live; this file decides in-place reuse (which
// analyze_memory applies, so that its live bytes and peak count shared memory
// once) and places the buffers. docs/memory-planning.md has the measurements.
//
// Terms:
//  - element-for-element read: node N reads buffer B element for element when
//    N is elementwise and every input of N whose storage is B is a value of
//    N's output shape (no broadcast) laid out as B's owner is (offset 0,
//    contiguous strides, the owner's element count: B itself or a reshape of
//    it, never a permute, slice or broadcast). The generated loop then reads
//    element i of every input before it writes element i of the output, so the
//    output may overwrite B. A fusion group (ir/fusion_group.h) reads B element
//    for element when every member that reads B does: the fused loop loads
//    every input of element i before it stores any output of element i.
//  - in-place reuse: a result buffer R whose kernel (its producer, or the
//    producer's fusion group) starts at position p takes over the memory of an
//    input buffer D of that kernel (MemoryBuffer::reuses) when
//      D is a result (never a param, state or input: those are written only by
//      the update rule of passes/memory.h), not a graph output nor an update's
//      value (they are read after the step), not already taken over,
//      D is made by an earlier kernel and last read by R's kernel, D and R
//      have the same byte size, and the kernel reads D element for element.
//    D's range then ends at p-1 and R's starts at p: one slot, counted once.
//    Taken in schedule order, so a chain (add → gelu → mul, each the last
//    reader of the one before) shares one slot.
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
#include <vector>

#include "ir/fusion_group.h"
#include "ir/graph.h"
#include "passes/memory.h"

namespace napkin::passes {

inline constexpr int64_t kArenaAlignment = 64;

// Whether `node` reads buffer `buffer` element for element (see above). False
// when the node does not read it at all.
bool reads_element_for_element(const ir::Graph& g, const ir::Node& node, ir::ValueId buffer);

// Marks in-place reuse on analyze_memory's buffers (MemoryBuffer::reuses) and
// ends each donor's range before its taker's kernel. `buffers` is in
// analyze_memory's order (residents, then results in schedule order), with
// ranges at kernel granularity (a fused kernel spans its group's positions).
void reuse_buffers_in_place(const ir::Graph& g, const ir::FusionGroups& groups, std::vector<MemoryBuffer>& buffers);

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

}  // namespace napkin::passes
