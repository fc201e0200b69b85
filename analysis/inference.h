// The inference half of the lecture's napkin math (`napkin report
// --inference`, docs/report.md#inference), from the inference program
// `napkin sample` runs (passes/derive_inference.h): what the parameters and
// the KV cache weigh, what a prefill of the whole context and one decode step
// cost in FLOPs and bytes, and what that allows on a device.
//
// Conventions:
//  - FLOPs and bytes are the time model's, per kernel after fusion
//    (analysis/step_time.h): bytes are each kernel's reads and writes.
//  - A decode step's attention is counted over the whole cache (the
//    context): the cost of the step at the last position; the mean over a
//    sequence is about half of that part.
//  - Tokens per second: the batch's new tokens over the predicted seconds
//    (prefill: batch × context tokens; decode: batch tokens a step).
//  - Memory- or compute-bound: the phase's FLOPs per byte against the
//    device's ridge, its matmul peak for the program's matmul dtype over its
//    main-memory bandwidth.
//  - The batch where decoding turns compute-bound: a decode step's bytes are
//    affine in the batch b, W + b·S (W: the weights, read once a step
//    whatever the batch; S: each sequence's cache and activations), its
//    FLOPs b·F; the smallest b with b·F / (W + b·S) >= ridge. W, S and F come
//    from the program at two batches, so they are the program's own numbers.
#pragma once

#include <cstdint>
#include <limits>

#include "analysis/devices.h"
#include "ir/graph.h"

namespace napkin::analysis {

struct InferencePhase {
  double flops = 0, bytes = 0;
  double seconds = 0;    // the time model's prediction (kernels without a peak left out)
  double tokens = 0;     // new tokens the phase produces logits for
  double intensity() const { return bytes > 0 ? flops / bytes : 0; }
  double tokens_per_second() const { return seconds > 0 ? tokens / seconds : 0; }
};

struct InferenceCost {
  int64_t batch = 0, context = 0, vocab = 0;
  int layers = 0;
  int64_t params = 0;
  double param_bytes = 0;
  double kv_bytes = 0;                // every layer's key and value caches, for the whole batch
  double kv_bytes_per_sequence = 0;   // kv_bytes / batch
  double kv_bytes_per_token = 0;      // kv_bytes_per_sequence / context
  InferencePhase prefill, decode;     // prefill: the whole context; decode: one step
  const Device* device = nullptr;
  ir::DType matmul_dtype = ir::DType::F32;
  double ridge = 0;                   // FLOP per byte where the roofline turns (peak / bandwidth)
  // A decode step at batch b: FLOPs b·decode_flops_per_sequence, bytes
  // decode_weight_bytes + b·decode_bytes_per_sequence.
  double decode_flops_per_sequence = 0, decode_weight_bytes = 0, decode_bytes_per_sequence = 0;
  // The smallest batch whose decode step is compute-bound; infinity when none is.
  double compute_bound_batch = std::numeric_limits<double>::infinity();
};

// `inference` at the batch it was derived for, `doubled` the same model at
// twice that batch (for the affine split); `device` must be given.
InferenceCost analyze_inference(const ir::Graph& inference, const ir::Graph& doubled, const Device& device);

}  // namespace napkin::analysis
