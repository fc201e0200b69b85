#include "analysis/in_place_reuse.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "ir/internal_check.h"

namespace napkin::analysis {

bool reads_element_for_element(const ir::Graph& g, const ir::Node& node, ir::ValueId buffer) {
  const ir::Value& owner = g.value(buffer);
  if (node.op == ir::Op::EmbeddingGrad) {
    // Its base (input 2), whole and contiguous, is added into as the result (the kernel adds in place when
    // the result is the base's buffer); dy and ids are read at any row.
    if (node.inputs.size() != 3) return false;
    const ir::Value& base = g.value(node.in(2));
    return base.storage == buffer && g.value(node.in(0)).storage != buffer && g.value(node.in(1)).storage != buffer &&
           base.type.numel() == owner.type.numel() && base.layout.offset == 0 &&
           base.layout.strides == ir::contiguous_layout(base.type.sizes()).strides;
  }
  if (ir::op_info(node.op).op_class != ir::OpClass::Elementwise) return false;
  const ir::TensorType& out = g.value(node.out()).type;
  bool reads = false;
  for (ir::ValueId in : node.inputs) {
    const ir::Value& v = g.value(in);
    if (v.storage != buffer) continue;
    reads = true;
    bool same_elements = v.type.same_shape(out) && v.type.numel() == owner.type.numel() && v.layout.offset == 0 &&
                         v.layout.strides == ir::contiguous_layout(v.type.sizes()).strides;
    if (!same_elements) return false;
  }
  return reads;
}

void reuse_buffers_in_place(const ir::Graph& g, const ir::FusionGroups& groups, std::vector<MemoryBuffer>& buffers) {
  // Buffers read after the step: never handed over.
  std::set<ir::ValueId> read_after_step;
  for (const auto& [label, v] : g.outputs) read_after_step.insert(g.value(v).storage);
  for (const ir::Graph::Update& u : g.updates) read_after_step.insert(g.value(u.value).storage);

  std::map<ir::ValueId, size_t> index;
  for (size_t i = 0; i < buffers.size(); ++i) index[buffers[i].value] = i;
  // What a kernel (a fusion group, or a node alone) reads: the buffers listed
  // in `buffers`, distinct, in order of first read, each with whether the
  // kernel reads it element for element. Once per group, not once per buffer
  // it writes: a group with many outputs made this quadratic.
  using KernelReads = std::vector<std::pair<ir::ValueId, bool>>;
  auto kernel_reads = [&](const std::vector<ir::NodeId>& kernel) {
    KernelReads reads;
    std::map<ir::ValueId, size_t> slot;  // buffer -> its entry in reads
    for (ir::NodeId id : kernel) {
      const ir::Node& member = g.node(id);
      std::set<ir::ValueId> seen;  // each buffer once per member
      for (ir::ValueId in : member.inputs) {
        ir::ValueId buffer = g.value(in).storage;
        if (!index.count(buffer) || !seen.insert(buffer).second) continue;
        bool element_for_element = reads_element_for_element(g, member, buffer);
        auto [it, added] = slot.emplace(buffer, reads.size());
        if (added) reads.emplace_back(buffer, element_for_element);
        else reads[it->second].second = reads[it->second].second && element_for_element;
      }
    }
    return reads;
  };
  std::vector<bool> taken(buffers.size(), false);  // by index in `buffers`
  // A kernel's donors: the buffers it reads that a result of it may take over
  // (every condition but the size and not being taken already), by byte
  // size, each size's in order of first read. R takes the first of its size
  // not taken. What disqualifies a buffer for a kernel stays true (its range
  // changes only when it is taken), so a buffer passed over once is dropped:
  // a kernel with many results and many inputs (AdamW's scalar group reads
  // every parameter's squared-gradient sum and makes every 1 - lr·wd) was
  // quadratic when each result scanned the inputs its siblings had taken.
  using Donors = std::map<int64_t, std::deque<size_t>>;
  auto donors_of = [&](const KernelReads& reads, int p, int last) {
    Donors donors;
    for (const auto& [buffer, element_for_element] : reads) {
      const size_t i = index.at(buffer);
      const MemoryBuffer& d = buffers[i];
      // d.first < p: made by an earlier kernel (an output of R's own kernel is written alongside R).
      if (d.resident || d.update_of != ir::kNoValue || read_after_step.count(d.value) || taken[i] || d.first >= p ||
          d.last != last || !element_for_element)
        continue;
      donors[d.bytes].push_back(i);
    }
    return donors;
  };
  // Per kernel: a fusion group by its id, a node alone by its id.
  std::map<std::pair<int, ir::NodeId>, Donors> kernel_donors;
  for (MemoryBuffer& r : buffers) {
    if (r.resident || r.update_of != ir::kNoValue) continue;
    // R's kernel: its producer's fusion group, spanning positions [p, last], or the producer alone.
    const int p = r.first;
    const int last = groups.kernel_last(p);
    const int gid = groups.group_at[p];
    const std::pair<int, ir::NodeId> kernel{gid, gid < 0 ? r.producer : ir::kNoNode};
    auto it = kernel_donors.find(kernel);
    if (it == kernel_donors.end()) {
      KernelReads reads = kernel_reads(gid < 0 ? std::vector<ir::NodeId>{r.producer} : groups.groups[gid].nodes);
      // A GEMM's epilogue runs inside the GEMM library (cuBLASLt documents D in place of C only when C is
      // the input it reads, not of its aux or bias): no result takes over what such a kernel reads.
      if (gid >= 0 && groups.groups[gid].contraction != ir::kNoNode)
        for (auto& read : reads) read.second = false;
      it = kernel_donors.emplace(kernel, donors_of(reads, p, last)).first;
    }
    auto same_size = it->second.find(r.bytes);
    if (same_size == it->second.end()) continue;
    std::deque<size_t>& candidates = same_size->second;
    while (!candidates.empty() && taken[candidates.front()]) candidates.pop_front();
    if (candidates.empty()) continue;
    const size_t i = candidates.front();
    candidates.pop_front();
    taken[i] = true;
    MemoryBuffer& d = buffers[i];
    d.last = p - 1;
    r.reuses = d.value;
  }
}

}  // namespace napkin::analysis
