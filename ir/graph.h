// The napkin IR: a graph of typed values and the nodes that produce them, in
// schedule order.
//
// Values are SSA: each is defined once, by a node, or is a graph input or a
// parameter. Node ids and value ids are stable (erased nodes stay as tombstones)
// so passes can keep maps keyed by id; `schedule` is the execution order and is
// always topological (the verifier checks it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ir/diagnostics.h"
#include "ir/op.h"
#include "ir/training_config.h"
#include "ir/type.h"

namespace napkin::ir {

// Input: fed each step (data). Param: trained, initialized from its InitSpec.
// State: optimizer state that persists across steps, zero at step 0.
// Result: computed by a node.
enum class ValueKind : uint8_t { Input, Param, State, Result };

// Which part of a training step a node belongs to. The schedule runs them in
// this order: forward, then backward (autodiff), then the optimizer update.
// An inference graph (passes/derive_inference.h) has three: Setup, what is
// computed from the parameters and constants alone (once, before the other
// two), Forward, its prefill of a whole context, and Decode, its step of one
// new token. The values index per-phase tables; schedule_rank is the order.
enum class Phase : uint8_t { Forward, Backward, Optimizer, Decode, Setup };
inline constexpr int kNumPhases = 5;
std::string_view phase_name(Phase p);
// A phase's place in the schedule: Setup, Forward, Backward, Optimizer, Decode.
int schedule_rank(Phase p);

struct Value {
  ValueId id = kNoValue;
  std::string name;  // user-facing name ("blocks.3.att") or "" for temporaries
  ValueKind kind = ValueKind::Result;
  TensorType type;
  Layout layout;              // position inside the buffer of `storage`
  ValueId storage = kNoValue;  // value that owns the buffer (itself unless a view)
  NodeId producer = kNoNode;  // kNoNode for inputs and params
  SourceLoc loc;
  bool is_view() const { return storage != id; }
};

// How a parameter is initialized (see docs/model-language.md for each kind).
struct InitSpec {
  enum class Kind : uint8_t { Zeros, Ones, Constant, Normal, TruncNormal, Xavier };
  Kind kind = Kind::Zeros;
  double value = 0;  // Constant
  double std = 0;    // Normal, TruncNormal, Xavier (derived: 1/sqrt(fan_in))
  double lo = 0;     // TruncNormal/Xavier lower cut (absolute)
  double hi = 0;     // TruncNormal/Xavier upper cut (absolute)
  int64_t fan_in = 0;
};
std::string to_string(const InitSpec& init);

struct Param {
  ValueId value = kNoValue;
  InitSpec init;
};

struct Node {
  NodeId id = kNoNode;
  Op op = Op::Constant;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  Attrs attrs;
  SourceLoc loc;       // the YAML text this node came from
  std::string scope;   // e.g. "blocks.3" inside a repeated block; "" at top level
  Phase phase = Phase::Forward;
  // For a backward node: the forward node whose gradient it helps compute.
  NodeId origin = kNoNode;
  // Fusion group (passes/fuse_elementwise.h; ir/fusion_group.h): nodes with
  // the same group id run as one kernel. -1: the node is its own kernel.
  int group = -1;
  bool erased = false;
  ValueId in(int i) const { return inputs.at(i); }
  ValueId out(int i = 0) const { return outputs.at(i); }
};

// The names of a moe() layer's routing axes: its T tokens (the input's
// leading axes flattened), an expert's C slots, and all E·C slots flattened.
// `napkin sample` rebuilds a layer at a phase's token count by them
// (passes/derive_inference.h).
inline constexpr std::string_view kMoeTokensDim = "moe_tokens";
inline constexpr std::string_view kMoeCapacityDim = "moe_capacity";
inline constexpr std::string_view kMoeSlotsDim = "moe_slots";

// A training graph's outputs named "metric.<name>" are numbers the trainer
// logs each step beside the loss (a moe() layer's dropped tokens).
inline constexpr std::string_view kMetricOutputPrefix = "metric.";

class Graph {
 public:
  std::string name;
  TrainingConfig config;
  std::vector<ValueId> inputs;
  std::vector<Param> params;
  // Named results a later stage needs, in order ("loss", "grad.<param>", ...).
  std::vector<std::pair<std::string, ValueId>> outputs;
  // Optimizer state (ValueKind::State), in creation order.
  std::vector<ValueId> state;
  // The parameter each per-parameter state value belongs to ("adam.m.wte":
  // wte), as the optimizer pass made it; state not in it is shared (the
  // step counter, the loss scale). ZeRO-1 gives a state to its
  // parameter's owner (codegen/plan.h Kernel::serves).
  std::map<ValueId, ValueId> state_param;
  // What a step writes back: at the end of the step each target (a param or a
  // state value) takes the value computed for it. Targets are distinct.
  struct Update {
    ValueId target = kNoValue;
    ValueId value = kNoValue;
  };
  std::vector<Update> updates;
  // The mixture-of-experts layers the frontend's moe() made, in forward
  // order: what the report needs to say which parameters a token uses
  // (docs/report.md "active parameters") and how many it drops. Expert
  // parameters are stacked on their first (experts) axis; a token uses
  // `top_k` of the `experts` slices of each.
  struct MoeLayer {
    std::string scope;  // the block instance ("layers.3"), "" at top level
    int64_t experts = 0, top_k = 0;
    int64_t tokens = 0;    // tokens routed per micro-batch (T)
    int64_t capacity = 0;  // slots per expert: ceil(capacity_factor * T * top_k / experts)
    double capacity_factor = 0;
    int64_t d_model = 0;
    ValueId router = kNoValue;                // param [experts, d_model]
    std::vector<ValueId> expert_params;       // params [experts, ...]
    std::string dropped_output;               // graph output: the (token, choice) pairs dropped this step
  };
  std::vector<MoeLayer> moe_layers;
  // The rng tensor (ir/rng.h): what random ops read besides their operands,
  // filled by the runtime before every forward; kNoValue until an op needs it.
  // rng_words caches its scalar views (ir::rng_words makes both).
  ValueId rng = kNoValue;
  std::vector<ValueId> rng_words;

  ValueId add_input(std::string name, TensorType type, SourceLoc loc);
  ValueId add_param(std::string name, TensorType type, InitSpec init, SourceLoc loc);
  ValueId add_state(std::string name, TensorType type, SourceLoc loc);
  // Sets `rng` to a new value of kind Input (not one of `inputs`: no data fills it).
  ValueId add_rng(TensorType type, SourceLoc loc);
  // Appends a node at the end of the schedule with outputs of the given types
  // (contiguous, owning their buffers; views get their layout set by the Builder).
  NodeId add_node(Op op, std::vector<ValueId> inputs, std::vector<TensorType> output_types,
                  Attrs attrs, SourceLoc loc, std::string scope = "", Phase phase = Phase::Forward);
  // Tombstones the nodes (their outputs must be unused) and drops them from the
  // schedule in one pass: erasing the dead half of a big graph one by one would be quadratic.
  void erase_nodes(const std::vector<NodeId>& ids);
  // Every use of `old` (scheduled nodes' inputs, step outputs, updates)
  // becomes `now`, and views of old's buffer become views of now's with the
  // same layout: `now` must be laid out as `old` is when such views exist
  // (both contiguous, one shape). The passes that replace a value use it.
  void replace_uses(ValueId old, ValueId now);
  // Sets the schedule to `base` (the schedule before a pass built nodes:
  // building appends them at the end) with the nodes listed for a node of
  // base placed right after it, in their order (the passes that build nodes
  // in place of others).
  void insert_after(const std::vector<NodeId>& base, const std::map<NodeId, std::vector<NodeId>>& after);

  const Value& value(ValueId id) const;
  Value& value(ValueId id);
  const Node& node(NodeId id) const;
  Node& node(NodeId id);
  int num_values() const { return static_cast<int>(values_.size()); }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }

  // Live nodes in execution order.
  const std::vector<NodeId>& schedule() const { return schedule_; }
  std::vector<NodeId>& mutable_schedule() { return schedule_; }

  ValueId find_output(const std::string& name) const;  // kNoValue if absent

  int64_t param_count() const;
  // The Param entry of a parameter value, or nullptr.
  const Param* find_param(ValueId v) const;

 private:
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<NodeId> schedule_;
  ValueId new_value(std::string name, ValueKind kind, TensorType type, SourceLoc loc);
};

}  // namespace napkin::ir
