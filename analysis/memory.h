// The memory of one training step, from the graph alone: which buffers exist,
// why, how long each is live in the schedule, and the peak. `napkin report`
// prints it (report/report.cpp); this file computes and never prints.
//
// Terms (every count is exact, in bytes):
//  - buffer: the memory of an owning value (Value::storage == its id). A view
//    (reshape, permute, broadcast, slice, select) owns nothing: it is a window
//    on its storage value's buffer. A buffer's size is its owner's
//    numel · dtype size (owners are contiguous; the verifier checks it).
//  - position: a node's index in g.schedule(), 0 for the first; a step of n
//    nodes runs positions 0 .. n-1.
//  - reads: the node at position p reads buffer B if one of its inputs has
//    storage B (B itself or any view of it, views of views included). The
//    graph's outputs and update values are read once the step is over.
//  - fused kernels (ir/fusion_group.h): a fusion group's internal values own
//    no buffer (they live in registers). The group runs as one kernel over
//    the positions it spans, [first, last]: a read by any member counts at
//    `last`, and the buffer of a group output starts at `first` (and lives at
//    least to `last`), so the kernel's inputs and outputs are all live while
//    it runs and never share bytes. An unfused node spans [p, p].
//  - resident: params, optimizer state (ValueKind::State) and inputs (the
//    batch) are allocated for the whole step: live at every position.
//  - live range of a result buffer made at position p: [p, q], q the last
//    position that reads it (p when nothing does), or n-1 when it is the buffer
//    of a graph output (the loss, "grad.*"): a later stage reads outputs after
//    the step. A node's inputs and its output are all live at its position.
//  - in-place reuse (analysis/in_place_reuse.h, MemoryOptions::in_place_reuse):
//    a result buffer R may take over the memory of an input buffer D of its
//    producer (MemoryBuffer::reuses = D) when D is last read there and the
//    producer reads D only element for element. D's range then ends at the
//    position before R's producer, so the bytes are counted once: as D up to
//    there, as R from there on.
//  - live bytes at position p: the sum of the buffers whose range holds p,
//    resident ones included. peak: the largest live bytes over all positions,
//    the first such position on ties; the peak of a phase: the same over the
//    positions of that phase's nodes only.
//  - categories, one per buffer, the first that applies:
//      parameters        a Param
//      optimizer state   a State
//      inputs            an Input
//      (an update's new value that is not written in place, see below: the
//       category of its target)
//      gradients         the buffer of a value of an output labelled "grad.*"
//      saved activations made by a forward-phase node and read by some
//                        backward-phase node (directly or through a view)
//      temporaries       every other result (the loss among them)
//  - update (target T <- value V, Graph::updates), S = V's buffer:
//      * S resident (V is T, or a view of a resident value), or S already
//        claimed by an earlier update: the step copies between buffers that
//        exist anyway; nothing is allocated.
//      * otherwise S is written in place of T, costing 0 bytes and owning no
//        live range (reads of V read T's buffer), when (a) S has T's byte size,
//        (b) nothing after the kernel that makes S (S's producer, or its
//        fusion group) reads T (no node, no output, no other update's value),
//        and (c) every node of that kernel that reads T is elementwise and
//        reads T itself with T's shape, so that each output element
//        overwrites only the element it was computed from. Then T's old
//        contents are dead when S is written, and at the end of the step T
//        already holds V.
//      * otherwise (the old T is still read later) S is counted as its own
//        buffer in T's category, live from its producer to the end of the
//        step, when it is copied into T. This is checked, not assumed: a
//        schedule that reads the old T late costs its bytes instead of an
//        internal error. MemoryUpdate::in_place says which case applied.
//    Update targets being params or state of V's type is a verifier invariant;
//    a violation here is an internal error.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "analysis/buffers.h"
#include "ir/graph.h"

namespace napkin::analysis {

// Live bytes at one position, with what makes them up.
struct MemoryPeak {
  // false: no node (in this phase); the step's peak is then the resident
  // buffers alone (position -1), a phase's peak is all zero.
  bool found = false;
  int position = -1;
  ir::NodeId node = ir::kNoNode;
  ir::Phase phase = ir::Phase::Forward;
  int64_t bytes = 0;           // resident buffers included
  CategoryBytes by_category{};  // sums to `bytes`
  // The buffers live there, largest first (equal sizes by value id).
  std::vector<MemoryBuffer> live;
  int64_t category_bytes(MemoryCategory c) const { return by_category[static_cast<int>(c)]; }
};

struct MemoryUpdate {
  ir::ValueId target = ir::kNoValue;
  ir::ValueId value = ir::kNoValue;
  ir::ValueId storage = ir::kNoValue;  // value's buffer
  // True when the update allocates nothing: written in place of the target, or
  // a copy between buffers that exist anyway. False: counted as its own buffer.
  bool in_place = true;
};

struct MemoryReport {
  // Every buffer that costs bytes: params, state, inputs (in the graph's
  // order), then results in schedule order.
  std::vector<MemoryBuffer> buffers;
  // Sum of the buffers of each category (each buffer once, whether or not
  // they are live together), and the same per dtype.
  CategoryBytes total{};
  std::array<std::map<ir::DType, int64_t>, kNumMemoryCategories> total_by_dtype;
  int64_t resident_bytes = 0;  // params + state + inputs
  std::vector<int64_t> live_bytes;  // per schedule position
  MemoryPeak peak;                  // over the whole step
  std::array<MemoryPeak, ir::kNumPhases> phase_peaks;  // indexed by ir::Phase
  std::vector<MemoryUpdate> updates;      // one per Graph::update, same order
  bool has_backward = false;              // some node is in the backward phase

  int64_t category_bytes(MemoryCategory c) const { return total[static_cast<int>(c)]; }
  const std::map<ir::DType, int64_t>& category_bytes_by_dtype(MemoryCategory c) const {
    return total_by_dtype[static_cast<int>(c)];
  }
  const MemoryPeak& phase_peak(ir::Phase p) const { return phase_peaks[static_cast<int>(p)]; }
};

struct MemoryOptions {
  bool in_place_reuse = true;  // false: every buffer its own memory (the plan without reuse)
};

MemoryReport analyze_memory(const ir::Graph& g, const MemoryOptions& options = {});

}  // namespace napkin::analysis
