// The program description a generated trainer carries: everything the
// runtime needs besides the kernels' code: the typed runtime::Program,
// written and read as one JSON document by runtime/program.cpp
// (docs/runtime.md lists the fields). JSON because it is
// also what `napkin build --emit-program` prints for a person to read.
#pragma once

#include <string>
#include <vector>

#include "analysis/step_time.h"
#include "codegen/plan.h"
#include "ir/graph.h"
#include "runtime/program.h"

namespace napkin::codegen {

// Facts from outside the plan.
struct ProgramFacts {
  std::string model_hash;   // identifies model + compiler; checkpoints record it
  double flops_per_step = 0;     // static count (analysis/cost.h), whole step
  double flops_forward = 0;      // forward phase only (eval)
  double flops_optimizer = 0;    // optimizer phase only (once per step, however many micro-batches)
  int64_t tokens_per_step = 0;
  std::string device = "cpu";    // the peak MFU is measured against
  double peak_flops = 0;         // of that device, in the matmul dtype
  std::string backend = "cpu";
  // Where the peak comes from (the device figure's source, analysis/devices.h)
  // and the local device file it was read from ("" for the built-in table).
  std::string peak_source, device_file;
  // The time model's prediction for this step on `device` (analysis/step_time.h);
  // empty kernels when the device is unknown.
  analysis::StepTime predicted;
};

// The facts of the training step `g` as a trainer for `device` (a name of
// analysis/devices.h; an unknown one gives no peak, so no MFU) reports them:
// static FLOPs per step and forward, tokens per step, and the device's peak
// for the step's matmul dtype (TF32's for f32 when `allow_tf32`).
ProgramFacts step_facts(const ir::Graph& g, const std::string& device, const std::string& model_hash,
                        const std::string& backend, bool allow_tf32 = false);

// The training settings the program carries (its "train" object: steps,
// seed, data, checkpointing, logging, the schedule ...), which the graph's
// text does not show: a cache of built trainers keys on them too.
std::string training_settings_json(const ir::Graph& g);

// The typed program (runtime/program.h) of `plan`, run with `launches`
// (the CPU backend's; one per kernel), and its JSON (runtime::program_json,
// the one writer).
runtime::Program describe_program(const ir::Graph& g, const KernelPlan& plan, const std::vector<Launch>& launches,
                                  const ProgramFacts& facts);
std::string program_json(const ir::Graph& g, const KernelPlan& plan, const std::vector<Launch>& launches,
                         const ProgramFacts& facts);

}  // namespace napkin::codegen
