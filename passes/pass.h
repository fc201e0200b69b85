// Passes and the pass manager.
//
// A pass rewrites a Graph in place and says whether it changed anything. User
// mistakes it finds go to Diagnostics (with the YAML location of the node);
// broken invariants are internal errors. The manager verifies the graph after
// every pass, can print it after any pass, and times each pass.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "ir/diagnostics.h"
#include "ir/graph.h"

namespace napkin::analysis {
struct Device;        // analysis/devices.h
struct Interconnect;  // analysis/distributed.h
}  // namespace napkin::analysis

namespace napkin::passes {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string_view name() const = 0;                        // "dce"
  virtual bool run(ir::Graph& g, ir::Diagnostics& diag) = 0;         // true iff the graph changed
};

// What the cast passes rewrote, rule by rule (passes/sink_casts.h,
// passes/matmul_epilogues.h): the report prints it.
struct CastPlacement {
  int views = 0;        // a value cast once instead of each view of it
  int concats = 0;      // a concat of the narrow values, cast after
  int round_trips = 0;  // a widening cast narrowed back, removed
  int reductions = 0;   // a reduction reading the narrow value, widening it as it loads
  int norms = 0;        // a norm storing its cast's dtype
  int norm_grads = 0;   // a norm's gradient reading the narrow dy, widening it as it loads
  int epilogues = 0;    // a bf16 GEMM storing its f32 sums
  int total() const { return views + concats + round_trips + reductions + norms + norm_grads + epilogues; }
};

struct PipelineOptions {
  std::vector<std::string> print_after;  // pass names, or "all"
  bool time_passes = false;
  std::ostream* trace = nullptr;  // where --print-after and --time-passes write
  // Rewrite spelled-out attention into the fused attention op
  // (passes/fuse_attention.h); --unfused-attention turns it off to compare.
  bool fuse_attention = true;
  // ZeRO-3: gather each parameter before its uses and reduce its gradient
  // onto its owner, as kernels of the step (passes/shard_parameters.h);
  // `napkin build --zero 3`. keep_gathered: the backward reads the
  // forward's gathered copies (--keep-gathered).
  bool shard_parameters = false;
  bool keep_gathered = false;
  // ZeRO-3: issue each unit's gathers ahead of its first use, where the
  // time model on shard_device over shard_link says they arrive in time
  // (--prefetch off: right before it). Null: the cpu row and "shm".
  bool prefetch = true;
  const analysis::Device* shard_device = nullptr;
  const analysis::Interconnect* shard_link = nullptr;
  int shard_ranks = 8;
  // Apply the rope of a fused attention's q and k as the attention loads them
  // (passes/fuse_rope.h; needs fuse_attention); --unfused-rope turns it off
  // to compare.
  bool fuse_rope = true;
  // Rewrite a matmul feeding cross_entropy into the fused classifier
  // (passes/fuse_classifier.h); --unfused-classifier turns it off to compare.
  bool fuse_classifier = true;
  // Move the precision policy's casts across views and concats to store
  // fewer bytes (passes/sink_casts.h); off only to compare.
  bool sink_casts = true;
  // Let contractions do the elementwise work on their results they can
  // (passes/matmul_epilogues.h); --unfused-epilogues turns it off to compare.
  bool matmul_epilogues = true;
  // Recompute saved elementwise values in the backward from narrower inputs
  // the step keeps anyway (passes/rematerialize.h); --no-rematerialize turns
  // it off to compare.
  bool rematerialize = true;
  // Add the residual stream's gradient in the norm's gradient kernel
  // (passes/norm_grad_residual.h; the same bits); off only to compare.
  bool norm_grad_residual = true;
  // Scatter a tied embedding's lookup gradient into the classifier's in
  // place (passes/embedding_grad_into.h); off only to compare.
  bool embedding_grad_into = true;
  // Let a fused attention store its output in the layout the head merge
  // copied it to (passes/attention_layout.h; the same bits); off only to compare.
  bool attention_layout = true;
};

class PassManager {
 public:
  explicit PassManager(PipelineOptions options) : options_(std::move(options)) {}
  void add(std::unique_ptr<Pass> pass) { passes_.push_back(std::move(pass)); }
  // Runs the passes in order; stops after a pass that reports a user error.
  // Returns false iff diagnostics has errors.
  bool run(ir::Graph& g, ir::Diagnostics& diag);
  std::vector<std::string> pass_names() const;

 private:
  PipelineOptions options_;
  std::vector<std::unique_ptr<Pass>> passes_;
};

// Verifies the graph and turns any violation into an internal error naming `after`.
void verify_or_die(const ir::Graph& g, std::string_view after);

}  // namespace napkin::passes
