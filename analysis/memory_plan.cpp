#include "analysis/memory_plan.h"

#include <algorithm>
#include <limits>
#include <set>

#include "ir/internal_check.h"

namespace napkin::analysis {

int64_t MemoryPlan::offset_of(const ir::Graph& g, ir::ValueId v) const {
  const ir::Value& value = g.value(v);
  auto it = storage_offset.find(value.storage);
  NAPKIN_INTERNAL_CHECK(it != storage_offset.end(), "value %{} has no arena slot", v);
  return it->second + value.layout.offset * ir::dtype_size(value.type.dtype);
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

}  // namespace napkin::analysis
