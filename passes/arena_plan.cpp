#include "passes/arena_plan.h"

#include <algorithm>

#include "ir/internal_check.h"

namespace napkin::passes {

int64_t ArenaPlan::offset_of(const ir::Graph& g, ir::ValueId v) const {
  const ir::Value& value = g.value(v);
  auto it = storage_offset.find(value.storage);
  NAPKIN_INTERNAL_CHECK(it != storage_offset.end(), "value has no arena slot");
  return it->second + value.layout.offset * ir::dtype_size(value.type.dtype);
}

namespace {

int64_t aligned(int64_t bytes) {
  return std::max<int64_t>(kArenaAlignment, (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment);
}

struct Slot {
  int64_t offset, size;
  int first, last;
};

bool conflict(const MemoryBuffer& b, const Slot& s) { return b.first <= s.last && s.first <= b.last; }

}  // namespace

ArenaPlan plan_arena(const MemoryReport& memory) {
  ArenaPlan plan;
  plan.liveness_peak = memory.peak.bytes;

  std::vector<const MemoryBuffer*> order;
  for (const MemoryBuffer& b : memory.buffers) order.push_back(&b);
  std::stable_sort(order.begin(), order.end(), [](const MemoryBuffer* a, const MemoryBuffer* b) {
    if (a->resident != b->resident) return a->resident;
    if (a->bytes != b->bytes) return a->bytes > b->bytes;
    if (a->first != b->first) return a->first < b->first;
    return a->value < b->value;
  });

  std::vector<Slot> placed;
  for (const MemoryBuffer* b : order) {
    int64_t size = aligned(b->bytes);
    // The conflicting slots by offset; take the lowest gap that fits.
    std::vector<const Slot*> busy;
    for (const Slot& s : placed)
      if (conflict(*b, s)) busy.push_back(&s);
    std::sort(busy.begin(), busy.end(), [](const Slot* x, const Slot* y) { return x->offset < y->offset; });
    int64_t offset = 0;
    for (const Slot* s : busy) {
      if (offset + size <= s->offset) break;
      offset = std::max(offset, s->offset + s->size);
    }
    placed.push_back({offset, size, b->first, b->last});
    plan.storage_offset[b->value] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
  }

  // An update written in place lives in its target's slot.
  for (const MemoryUpdate& u : memory.updates) {
    if (plan.has(u.storage)) continue;
    NAPKIN_INTERNAL_CHECK(u.in_place && plan.has(u.target), "update value without a slot");
    plan.storage_offset[u.storage] = plan.storage_offset.at(u.target);
  }
  return plan;
}

}  // namespace napkin::passes
