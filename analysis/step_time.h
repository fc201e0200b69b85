// The time model: the predicted time of one training step on a device, kernel
// by kernel after fusion: the step's kernels (analysis/step_kernels.h), which
// the backends run, in their order. `napkin report --device`, the
// trainer's banner, its end-of-run line, `--profile` and the metrics file all
// print this one prediction (docs/report.md, "time model").
//
// Per kernel:
//   compute = FLOPs / rate      rate: a contraction's matmul peak for its dtype
//                               times the device's GEMM efficiency at its
//                               narrowest dim; a loop kernel's loop_flops
//             + transcendentals / transcendental_rate   (loop kernels: exp,
//                               tanh, ... are library calls, not one FLOP)
//   memory  = bytes / bandwidth an input comes from the cache level when fewer
//                               than the device's cache_bytes, it included, were moved since
//                               its buffer was last touched (an LRU reuse
//                               distance over the repeating schedule), else
//                               from main memory; outputs go to the cache when
//                               the kernel's bytes fit in it
//   time    = max(compute, memory) + launch_seconds
// bytes: the op table's rule for an unfused node; a fusion group reads each
// input once (its distinct elements) and writes its outputs.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "analysis/cost.h"
#include "analysis/devices.h"
#include "analysis/step_kernels.h"
#include "ir/fusion_group.h"
#include "ir/graph.h"

namespace napkin::analysis {

struct KernelTime {
  // Of its step kernel (analysis/step_kernels.h): the last node, group, batch, phase and kernel_class.
  ir::NodeId node = ir::kNoNode;
  int group = -1, batch = -1;
  ir::Phase phase = ir::Phase::Forward;
  KernelClass kind = KernelClass::Elementwise;
  double flops = 0, bytes = 0;
  double transcendentals = 0;  // exp, tanh, ... evaluations (ir::transcendentals)
  ir::DType compute_dtype = ir::DType::F32;
  double narrowest = 0;      // a contraction's narrowest GEMM dim (0 otherwise)
  double rate = 0;           // FLOP/s the compute term uses (peak x efficiency, or loop_flops)
  double bandwidth = 0;      // bytes / memory_seconds: the effective bandwidth of its reads and writes
  double compute_seconds = 0, memory_seconds = 0, seconds = 0;
  double roofline_seconds = 0;  // at the peak rate for its dtype or main-memory bandwidth, no launch (StepTime)
  bool no_peak = false;      // the device has no peak for compute_dtype: time left out
  std::string lines;         // "models/gpt.yaml:39,40" (the YAML lines of its nodes)
  std::string scope;         // "blocks.0" or ""
  bool compute_bound() const { return compute_seconds > memory_seconds; }
};

struct StepTime {
  const Device* device = nullptr;
  std::vector<KernelTime> kernels;  // one per step kernel (analysis/step_kernels.h), in its order
  double seconds = 0;               // sum over kernels (those without a peak left out)
  double launch_seconds = 0;        // the part of `seconds` that is launch overhead
  std::array<double, kNumKernelClasses> class_seconds{};
  int kernels_without_peak = 0;
  // MFU the prediction implies: the step's counted FLOPs / (seconds x matmul peak).
  double mfu = 0;
  // The pure roofline of the same kernels: each at the device's peak rate for
  // its dtype (the matmul peak for contractions, attention and the
  // classifier; no GEMM efficiency, no transcendental rate) or at main-memory
  // bandwidth for all its bytes (no cache), whichever is slower, and no
  // launch overhead: what fusion alone leaves between the step and the peak.
  double roofline_seconds = 0;
  double roofline_mfu = 0;
};

// The YAML lines of `nodes`: "models/gpt.yaml:39,40" ("" when none is known).
std::string yaml_lines(const ir::Graph& g, const std::vector<ir::NodeId>& nodes);

// Bytes a fusion group moves: each input's distinct elements once, each output.
double group_bytes(const ir::Graph& g, const ir::FusionGroup& group);

// `cost` is analyze_step(g, ...) of the same graph (categories and dtypes).
StepTime predict_step_time(const ir::Graph& g, const StepCost& cost, const Device& device, bool allow_tf32 = false);

}  // namespace napkin::analysis
