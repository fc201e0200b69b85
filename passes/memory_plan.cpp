#include "passes/memory_plan.h"

#include <algorithm>
#include <limits>
#include <set>

#include "ir/internal_check.h"

namespace napkin::passes {

int64_t MemoryPlan::offset_of(const ir::Graph& g, ir::ValueId v) const {
  const ir::Value& value = g.value(v);
  auto it = storage_offset.find(value.storage);
  NAPKIN_INTERNAL_CHECK(it != storage_offset.end(), "value %{} has no arena slot", v);
  return it->second + value.layout.offset * ir::dtype_size(value.type.dtype);
}

bool reads_element_for_element(const ir::Graph& g, const ir::Node& node, ir::ValueId buffer) {
  if (ir::op_info(node.op).op_class != ir::OpClass::Elementwise) return false;
  const ir::Value& owner = g.value(buffer);
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
  std::map<int, KernelReads> group_reads;
  std::set<ir::ValueId> taken;
  for (MemoryBuffer& r : buffers) {
    if (r.resident || r.update_of != ir::kNoValue) continue;
    // R's kernel: its producer's fusion group, spanning positions [p, last], or the producer alone.
    const int p = r.first;
    const int last = groups.kernel_last(p);
    const int gid = groups.group_at[p];
    KernelReads alone;
    const KernelReads* reads = &alone;
    if (gid < 0) {
      alone = kernel_reads({r.producer});
    } else {
      auto it = group_reads.find(gid);
      if (it == group_reads.end()) it = group_reads.emplace(gid, kernel_reads(groups.groups[gid].nodes)).first;
      reads = &it->second;
    }
    for (const auto& [buffer, element_for_element] : *reads) {
      MemoryBuffer& d = buffers[index.at(buffer)];
      // d.first < p: made by an earlier kernel (an output of R's own kernel is written alongside R).
      if (d.resident || d.update_of != ir::kNoValue || read_after_step.count(d.value) || taken.count(d.value) ||
          d.first >= p || d.last != last || d.bytes != r.bytes || !element_for_element)
        continue;
      taken.insert(d.value);
      d.last = p - 1;
      r.reuses = d.value;
      break;
    }
  }
}

int64_t naive_bytes(const MemoryReport& memory) {
  int64_t sum = 0;
  for (const MemoryBuffer& b : memory.buffers) sum += b.bytes;
  return sum;
}

namespace {

int64_t aligned(int64_t bytes) {
  return std::max<int64_t>(kArenaAlignment, (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment);
}

// One chain of buffers sharing a slot (see the header).
struct Item {
  std::vector<ir::ValueId> members;  // the root first
  int64_t size = 0;
  int first = 0, last = 0;
  bool resident = false;
};

struct Slot {
  int64_t offset, size;
  int first, last;
};

bool conflict(const Item& item, const Slot& s) { return item.first <= s.last && s.first <= item.last; }

std::vector<Item> chains(const MemoryReport& memory) {
  std::map<ir::ValueId, size_t> item_of;  // buffer -> its chain
  std::vector<Item> items;
  for (const MemoryBuffer& b : memory.buffers) {  // takers come after what they take over
    size_t i;
    if (b.reuses == ir::kNoValue) {
      i = items.size();
      items.push_back({{}, aligned(b.bytes), b.first, b.last, b.resident});
    } else {
      auto it = item_of.find(b.reuses);
      NAPKIN_INTERNAL_CHECK(it != item_of.end(), "buffer %{} reuses %{}, which is not listed before it", b.value, b.reuses);
      i = it->second;
      items[i].first = std::min(items[i].first, b.first);
      items[i].last = std::max(items[i].last, b.last);
    }
    items[i].members.push_back(b.value);
    item_of[b.value] = i;
  }
  return items;
}

// The offset where `size` bytes go among the conflicting slots `busy` (sorted
// by offset; they may overlap each other).
int64_t choose_offset(const std::vector<const Slot*>& busy, int64_t size, Placement placement) {
  int64_t end = 0;  // the end of the slots seen so far
  int64_t best = -1, best_gap = std::numeric_limits<int64_t>::max();
  for (const Slot* s : busy) {
    int64_t gap = s->offset - end;
    if (gap >= size) {
      if (placement == Placement::LowestFit) return end;
      if (gap < best_gap) best = end, best_gap = gap;
    }
    end = std::max(end, s->offset + s->size);
  }
  return best >= 0 ? best : end;
}

}  // namespace

MemoryPlan plan_memory(const MemoryReport& memory, Placement placement) {
  MemoryPlan plan;
  plan.liveness_peak = memory.peak.bytes;
  for (const MemoryBuffer& b : memory.buffers)
    if (b.reuses != ir::kNoValue) ++plan.in_place_buffers, plan.in_place_bytes += b.bytes;

  std::vector<Item> items = chains(memory);
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.resident != b.resident) return a.resident;
    if (a.size != b.size) return a.size > b.size;
    if (a.first != b.first) return a.first < b.first;
    return a.members[0] < b.members[0];
  });

  // Kept sorted by offset, so the conflicting slots come out in offset order
  // without a sort per item (which made many long-lived buffers N^2 log N).
  std::vector<Slot> placed;
  for (const Item& item : items) {
    std::vector<const Slot*> busy;
    for (const Slot& s : placed)
      if (conflict(item, s)) busy.push_back(&s);
    int64_t offset = choose_offset(busy, item.size, placement);
    Slot slot{offset, item.size, item.first, item.last};
    placed.insert(std::upper_bound(placed.begin(), placed.end(), slot,
                                   [](const Slot& x, const Slot& y) { return x.offset < y.offset; }),
                  slot);
    for (ir::ValueId v : item.members) plan.storage_offset[v] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + item.size);
  }

  // An update written in place lives in its target's slot.
  for (const MemoryUpdate& u : memory.updates) {
    if (plan.has(u.storage)) continue;
    NAPKIN_INTERNAL_CHECK(u.in_place && plan.has(u.target), "update value %{} without a slot", u.value);
    plan.storage_offset[u.storage] = plan.storage_offset.at(u.target);
  }
  return plan;
}

}  // namespace napkin::passes
