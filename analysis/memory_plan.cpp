#include "analysis/memory_plan.h"

#include <algorithm>
#include <limits>

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

// Arena bytes [begin, end) in use.
struct Span {
  int64_t begin, end;
};

// Disjoint spans sorted by offset; touching ones are merged (a gap of 0 bytes
// fits nothing, so the merged set has the same gaps).
class SpanSet {
 public:
  void insert(Span s) {
    auto first = std::lower_bound(spans_.begin(), spans_.end(), s.begin,
                                  [](const Span& x, int64_t begin) { return x.end < begin; });
    auto last = first;
    while (last != spans_.end() && last->begin <= s.end) {
      s.begin = std::min(s.begin, last->begin);
      s.end = std::max(s.end, last->end);
      ++last;
    }
    spans_.insert(spans_.erase(first, last), s);
  }
  const std::vector<Span>& spans() const { return spans_; }

 private:
  std::vector<Span> spans_;
};

// The arena bytes in use by placed slots, by schedule position: a segment
// tree over positions [0, n) in which a slot live over [first, last] is
// recorded at the O(log n) nodes whose ranges tile [first, last] (`own`),
// and in `below` of those nodes and all their ancestors. The bytes used by
// the slots live at some position of [first, last] are then the union of
// `below` of the nodes tiling it and `own` of their ancestors: O(log n) sets,
// each merged into few spans, instead of a scan of every slot placed (which
// made a model of N long-lived buffers N^2).
class ArenaUse {
 public:
  explicit ArenaUse(int positions) : n_(positions), own_(std::max(0, 2 * positions - 1)), below_(own_.size()) {}

  void add(int first, int last, Span bytes) {
    if (first <= last) add(0, 0, n_ - 1, first, last, bytes);
  }

  // The bytes used at some position of [first, last], sorted, disjoint.
  std::vector<Span> used(int first, int last) const {
    std::vector<Span> all;
    if (first <= last) collect(0, 0, n_ - 1, first, last, all);
    std::sort(all.begin(), all.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
    std::vector<Span> merged;
    for (const Span& s : all) {
      if (!merged.empty() && s.begin <= merged.back().end) merged.back().end = std::max(merged.back().end, s.end);
      else merged.push_back(s);
    }
    return merged;
  }

 private:
  // Node `node` covers positions [lo, hi]; its children are node + 1
  // ([lo, mid]) and node + 2 * (mid - lo + 1) ([mid + 1, hi]): 2n - 1 nodes.
  void add(int node, int lo, int hi, int first, int last, Span bytes) {
    below_[node].insert(bytes);
    if (first <= lo && hi <= last) {
      own_[node].insert(bytes);
      return;
    }
    int mid = lo + (hi - lo) / 2;
    if (first <= mid) add(node + 1, lo, mid, first, last, bytes);
    if (last > mid) add(node + 2 * (mid - lo + 1), mid + 1, hi, first, last, bytes);
  }

  void collect(int node, int lo, int hi, int first, int last, std::vector<Span>& out) const {
    const SpanSet& set = first <= lo && hi <= last ? below_[node] : own_[node];
    out.insert(out.end(), set.spans().begin(), set.spans().end());
    if (first <= lo && hi <= last) return;
    int mid = lo + (hi - lo) / 2;
    if (first <= mid) collect(node + 1, lo, mid, first, last, out);
    if (last > mid) collect(node + 2 * (mid - lo + 1), mid + 1, hi, first, last, out);
  }

  int n_;
  std::vector<SpanSet> own_, below_;
};

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

// The offset where `size` bytes go among the bytes in use `busy` (sorted,
// disjoint).
int64_t choose_offset(const std::vector<Span>& busy, int64_t size, Placement placement) {
  int64_t end = 0;  // the end of the spans seen so far
  int64_t best = -1, best_gap = std::numeric_limits<int64_t>::max();
  for (const Span& s : busy) {
    int64_t gap = s.begin - end;
    if (gap >= size) {
      if (placement == Placement::LowestFit) return end;
      if (gap < best_gap) best = end, best_gap = gap;
    }
    end = std::max(end, s.end);
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

  int positions = 0;
  for (const Item& item : items) positions = std::max(positions, item.last + 1);
  ArenaUse use(positions);
  for (const Item& item : items) {
    int64_t offset = choose_offset(use.used(item.first, item.last), item.size, placement);
    use.add(item.first, item.last, {offset, offset + item.size});
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
