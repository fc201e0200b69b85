// Who reads each value of a graph: the one use-list the passes ask before
// they rewrite a value, instead of each counting readers its own way.
//
// Terms:
//  - a use: an input slot of a scheduled node. A node that reads v twice uses
//    it twice; step outputs and updates are not uses (see escapes).
//  - readers(v), readers by value: the node of each use of v itself, in
//    schedule order. A view of v is one reader, whoever reads the view.
//  - buffer_readers(v), readers by storage: the node of each use of v's
//    buffer, v's storage value or any view of it (Value::storage), in
//    schedule order: the view nodes and the nodes that read the views.
//  - escapes(v): v's buffer outlives the step's kernels: it is (or a view of
//    it is) a step output or the source of an update. A pass that would stop
//    storing a value, or store it elsewhere, asks here.
// A snapshot of the graph as built: a pass rebuilds it after the rewrites
// whose uses it needs to see. Views a rewrite repoints keep the buffer they
// had (sink_casts asks about values its own round repoints).
#pragma once

#include <vector>

#include "ir/graph.h"

namespace napkin::ir {

class UseList {
 public:
  explicit UseList(const Graph& g);
  const std::vector<NodeId>& readers(ValueId v) const { return readers_[v]; }
  const std::vector<NodeId>& buffer_readers(ValueId v) const { return buffer_readers_[storage_[v]]; }
  bool escapes(ValueId v) const { return escaping_[storage_[v]]; }
  // v is read by one use and its buffer does not escape: the reader may take it over.
  bool single(ValueId v) const { return readers_[v].size() == 1 && !escapes(v); }
  // The same of v's buffer: one use of it or of a view of it, and it does not escape.
  bool single_buffer(ValueId v) const { return buffer_readers(v).size() == 1 && !escapes(v); }
  // Some node reads v's buffer through a view of it.
  bool read_through_view(ValueId v) const {
    return buffer_readers(v).size() != readers_[storage_[v]].size();
  }

 private:
  std::vector<ValueId> storage_;
  std::vector<std::vector<NodeId>> readers_, buffer_readers_;
  std::vector<bool> escaping_;  // per storage value
};

}  // namespace napkin::ir
