// In-place reuse: which result buffer takes over the memory of an input
// buffer its kernel reads for the last time. analyze_memory (analysis/memory.h)
// applies it, so that its live bytes and peak count shared memory once; the
// memory plan (analysis/memory_plan.h) then places each chain as one item.
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
//    Also the embedding gradient into a base (embedding_grad's third input,
//    whole and contiguous): its kernel adds dy's rows into the base's, in
//    place when the result is the base's buffer.
//  - in-place reuse: a result buffer R whose kernel (its producer, or the
//    producer's fusion group) starts at position p takes over the memory of an
//    input buffer D of that kernel (MemoryBuffer::reuses) when
//      D is a result (never a param, state or input: those are written only by
//      the update rule of analysis/memory.h), not a graph output nor an update's
//      value (they are read after the step), not already taken over,
//      D is made by an earlier kernel and last read by R's kernel, D and R
//      have the same byte size, and the kernel reads D element for element.
//    D's range then ends at p-1 and R's starts at p: one slot, counted once.
//    Never for a GEMM epilogue's kernel (ir/gemm_epilogue.h): the GEMM
//    library's epilogue makes no promise of element order for its aux.
//    Taken in schedule order, so a chain (add → gelu → mul, each the last
//    reader of the one before) shares one slot.
#pragma once

#include <vector>

#include "analysis/buffers.h"
#include "ir/fusion_group.h"
#include "ir/graph.h"

namespace napkin::analysis {

// Whether `node` reads buffer `buffer` element for element (see above). False
// when the node does not read it at all.
bool reads_element_for_element(const ir::Graph& g, const ir::Node& node, ir::ValueId buffer);

// Marks in-place reuse on analyze_memory's buffers (MemoryBuffer::reuses) and
// ends each donor's range before its taker's kernel. `buffers` is in
// analyze_memory's order (residents, then results in schedule order), with
// ranges at kernel granularity (a fused kernel spans its group's positions).
void reuse_buffers_in_place(const ir::Graph& g, const ir::FusionGroups& groups, std::vector<MemoryBuffer>& buffers);

}  // namespace napkin::analysis
