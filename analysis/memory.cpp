#include "analysis/memory.h"

#include <fmt/format.h>

#include <algorithm>

#include "analysis/in_place_reuse.h"
#include "ir/fusion_group.h"
#include "ir/internal_check.h"

namespace napkin::analysis {

namespace {

int idx(MemoryCategory c) { return static_cast<int>(c); }

MemoryCategory resident_category(ir::ValueKind kind) {
  switch (kind) {
    case ir::ValueKind::Param: return MemoryCategory::Parameters;
    case ir::ValueKind::State: return MemoryCategory::OptimizerState;
    case ir::ValueKind::Input: return MemoryCategory::Inputs;
    case ir::ValueKind::Result: break;
  }
  NAPKIN_INTERNAL_CHECK(false, "a result is not resident");
  return MemoryCategory::Temporaries;
}

MemoryBuffer make_buffer(const ir::Graph& g, ir::ValueId v, MemoryCategory category) {
  const ir::Value& value = g.value(v);
  return {.value = v,
          .name = value.name.empty() ? fmt::format("%{}", v) : value.name,
          .bytes = value.type.bytes(),
          .dtype = value.type.dtype,
          .category = category,
          .producer = value.producer,
          .line = value.loc.known() ? value.loc.line : 0};
}

// Whether the kernel making S (the value at position `at`; its fusion group,
// or its node alone) may write S over update target T: no node after that
// kernel reads T (the step's end neither: last_read), and every node of the
// kernel that reads T is elementwise and reads T itself with T's shape, so
// that each output element overwrites only the element it was computed from.
// readers: the positions of the nodes that read T, ascending (a kernel may
// span a whole batch of updates: scanning its positions made N updates N^2).
bool may_overwrite(const ir::Graph& g, const ir::FusionGroups& groups, const std::vector<int>& last_read,
                   const std::vector<int>& readers, int at, ir::ValueId target) {
  int first = groups.kernel_first(at), last = groups.kernel_last(at);
  if (last_read[target] > last) return false;
  const std::vector<ir::NodeId>& schedule = g.schedule();
  for (auto p = std::lower_bound(readers.begin(), readers.end(), first); p != readers.end() && *p <= last; ++p) {
    const ir::Node& n = g.node(schedule[*p]);
    for (ir::ValueId in : n.inputs) {
      if (g.value(in).storage != target) continue;
      if (in != target || ir::op_info(n.op).op_class != ir::OpClass::Elementwise ||
          !g.value(target).type.same_shape(g.value(n.out()).type))
        return false;
    }
  }
  return true;
}

void sort_largest_first(std::vector<MemoryBuffer>& buffers) {
  std::sort(buffers.begin(), buffers.end(), [](const MemoryBuffer& a, const MemoryBuffer& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.value < b.value;
  });
}

void fill_peak(const MemoryReport& r, const ir::Graph& g, int position, const std::vector<CategoryBytes>& live,
               MemoryPeak& peak) {
  peak.found = true;
  peak.position = position;
  peak.node = g.schedule()[position];
  peak.phase = g.node(peak.node).phase;
  peak.bytes = r.live_bytes[position];
  peak.by_category = live[position];
  for (const MemoryBuffer& b : r.buffers)
    if (b.first <= position && position <= b.last) peak.live.push_back(b);
  sort_largest_first(peak.live);
}

}  // namespace

MemoryReport analyze_memory(const ir::Graph& g, const MemoryOptions& options) {
  MemoryReport r;
  const std::vector<ir::NodeId>& schedule = g.schedule();
  const int n = static_cast<int>(schedule.size());
  const int last_position = n - 1;

  // Reads per buffer: the last position, and whether a backward node reads
  // it. A fused kernel reads its inputs at every position it spans.
  const ir::FusionGroups groups = ir::fusion_groups(g);
  std::vector<int> last_read(g.num_values(), -1);
  std::vector<int> produced_at(g.num_values(), -1);
  std::vector<bool> read_by_backward(g.num_values(), false);
  std::vector<std::vector<int>> update_target_readers(g.num_values());  // positions, for may_overwrite
  std::vector<bool> update_target(g.num_values(), false);
  for (const ir::Graph::Update& u : g.updates) update_target[u.target] = true;
  for (int p = 0; p < n; ++p) {
    const ir::Node& node = g.node(schedule[p]);
    if (node.phase == ir::Phase::Backward) r.has_backward = true;
    for (ir::ValueId in : node.inputs) {
      ir::ValueId s = g.value(in).storage;
      last_read[s] = std::max(last_read[s], groups.kernel_last(p));
      if (node.phase == ir::Phase::Backward) read_by_backward[s] = true;
      std::vector<int>& readers = update_target_readers[s];
      if (update_target[s] && (readers.empty() || readers.back() != p)) readers.push_back(p);
    }
    for (ir::ValueId out : node.outputs) produced_at[out] = p;
  }

  // Outputs and update values are read once the step is over (position n):
  // a result buffer stays live to the end, and a resident one (an output or
  // update naming an old param) cannot be overwritten in place.
  std::vector<bool> to_end(g.num_values(), false), gradient(g.num_values(), false);
  for (const auto& [label, v] : g.outputs) {
    ir::ValueId s = g.value(v).storage;
    to_end[s] = true;
    last_read[s] = n;
    if (label.rfind("grad.", 0) == 0) gradient[s] = true;
  }
  for (const ir::Graph::Update& u : g.updates) last_read[g.value(u.value).storage] = n;

  // Updates: in place (no buffer), a copy between existing buffers (no
  // buffer), or a separate buffer in the target's category.
  std::vector<bool> claimed(g.num_values(), false);
  std::vector<ir::ValueId> separate_update_of(g.num_values(), ir::kNoValue);
  for (const ir::Graph::Update& u : g.updates) {
    const ir::Value& target = g.value(u.target);
    const ir::Value& value = g.value(u.value);
    NAPKIN_INTERNAL_CHECK(target.kind == ir::ValueKind::Param || target.kind == ir::ValueKind::State,
                          "update target %{} is neither a param nor optimizer state", u.target);
    NAPKIN_INTERNAL_CHECK(target.type.dtype == value.type.dtype && target.type.same_shape(value.type),
                          "update of %{} {} from %{} {}", u.target, ir::to_string(target.type), u.value,
                          ir::to_string(value.type));
    MemoryUpdate m{u.target, u.value, value.storage, true};
    const ir::Value& buffer = g.value(value.storage);
    if (buffer.kind == ir::ValueKind::Result && !claimed[buffer.id]) {
      NAPKIN_INTERNAL_CHECK(produced_at[buffer.id] >= 0, "update of %{} reads %{}, which no scheduled node makes",
                            u.target, u.value);
      claimed[buffer.id] = true;
      int at = produced_at[buffer.id];
      m.in_place = buffer.type.bytes() == target.type.bytes() &&
                   may_overwrite(g, groups, last_read, update_target_readers[u.target], at, u.target);
      if (!m.in_place) {
        separate_update_of[buffer.id] = u.target;
        to_end[buffer.id] = true;  // copied into the target at the end of the step
      }
    }
    r.updates.push_back(m);
  }

  // The buffers.
  auto add_resident = [&](ir::ValueId v) {
    MemoryBuffer b = make_buffer(g, v, resident_category(g.value(v).kind));
    b.resident = true;
    b.first = 0;
    b.last = last_position;
    r.resident_bytes += b.bytes;
    r.buffers.push_back(std::move(b));
  };
  for (const ir::Param& p : g.params) add_resident(p.value);
  for (ir::ValueId v : g.state) add_resident(v);
  for (ir::ValueId v : g.inputs) add_resident(v);
  if (g.rng != ir::kNoValue) add_resident(g.rng);  // written by the runtime before every forward
  for (int p = 0; p < n; ++p) {
    const ir::Node& node = g.node(schedule[p]);
    for (ir::ValueId out : node.outputs) {
      if (g.value(out).storage != out) continue;  // a view: no buffer of its own
      if (groups.internal[out]) continue;         // held in registers inside its fused kernel
      if (claimed[out] && separate_update_of[out] == ir::kNoValue) continue;  // written in place
      MemoryCategory category;
      if (separate_update_of[out] != ir::kNoValue)
        category = resident_category(g.value(separate_update_of[out]).kind);
      else if (gradient[out])
        category = MemoryCategory::Gradients;
      else if (node.phase == ir::Phase::Forward && read_by_backward[out])
        category = MemoryCategory::SavedActivations;
      else
        category = MemoryCategory::Temporaries;
      MemoryBuffer b = make_buffer(g, out, category);
      b.first = groups.kernel_first(p);  // a fused kernel writes its outputs at every position it spans
      b.last = to_end[out] ? last_position : std::max(groups.kernel_last(p), last_read[out]);
      b.update_of = separate_update_of[out];
      r.buffers.push_back(std::move(b));
    }
  }
  if (options.in_place_reuse) reuse_buffers_in_place(g, groups, r.buffers);
  for (const MemoryBuffer& b : r.buffers) {
    r.total[idx(b.category)] += b.bytes;
    r.total_by_dtype[idx(b.category)][b.dtype] += b.bytes;
  }

  // Live bytes per position and category: +bytes at `first`, -bytes after `last`.
  std::vector<CategoryBytes> live(n + 1, CategoryBytes{});
  for (const MemoryBuffer& b : r.buffers) {
    if (b.first > b.last) continue;  // resident buffers of an empty schedule
    live[b.first][idx(b.category)] += b.bytes;
    live[b.last + 1][idx(b.category)] -= b.bytes;
  }
  r.live_bytes.assign(n, 0);
  for (int p = 0; p < n; ++p) {
    if (p > 0)
      for (int c = 0; c < kNumMemoryCategories; ++c) live[p][c] += live[p - 1][c];
    for (int c = 0; c < kNumMemoryCategories; ++c) r.live_bytes[p] += live[p][c];
  }

  // Peaks: the first position with the most live bytes, overall and per phase.
  int best = -1;
  std::array<int, ir::kNumPhases> best_in_phase{-1, -1, -1, -1, -1};
  for (int p = 0; p < n; ++p) {
    if (best < 0 || r.live_bytes[p] > r.live_bytes[best]) best = p;
    int& phase_best = best_in_phase[static_cast<int>(g.node(schedule[p]).phase)];
    if (phase_best < 0 || r.live_bytes[p] > r.live_bytes[phase_best]) phase_best = p;
  }
  if (best >= 0) {
    fill_peak(r, g, best, live, r.peak);
  } else {
    // No nodes: only the resident buffers.
    r.peak.bytes = r.resident_bytes;
    for (const MemoryBuffer& b : r.buffers) r.peak.by_category[idx(b.category)] += b.bytes;
    r.peak.live = r.buffers;
    sort_largest_first(r.peak.live);
  }
  for (int ph = 0; ph < ir::kNumPhases; ++ph)
    if (best_in_phase[ph] >= 0) fill_peak(r, g, best_in_phase[ph], live, r.phase_peaks[ph]);
  return r;
}

}  // namespace napkin::analysis
