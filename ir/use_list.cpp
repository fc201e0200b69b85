#include "ir/use_list.h"

namespace napkin::ir {

UseList::UseList(const Graph& g)
    : storage_(g.num_values()), readers_(g.num_values()), buffer_readers_(g.num_values()), escaping_(g.num_values()) {
  for (ValueId v = 0; v < g.num_values(); ++v) storage_[v] = g.value(v).storage;
  for (NodeId id : g.schedule())
    for (ValueId v : g.node(id).inputs) {
      readers_[v].push_back(id);
      buffer_readers_[storage_[v]].push_back(id);
    }
  for (const auto& [label, v] : g.outputs) escaping_[storage_[v]] = true;
  for (const Graph::Update& u : g.updates) escaping_[storage_[u.value]] = true;
}

}  // namespace napkin::ir
