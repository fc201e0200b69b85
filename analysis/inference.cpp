#include "analysis/inference.h"

#include <cmath>

#include "analysis/cost.h"
#include "analysis/step_time.h"
#include "ir/internal_check.h"

namespace napkin::analysis {

namespace {

const ir::Value& named_input(const ir::Graph& g, const std::string& name) {
  for (ir::ValueId v : g.inputs)
    if (g.value(v).name == name) return g.value(v);
  NAPKIN_INTERNAL_CHECK(false, "analyze_inference: the graph has no input {} (not an inference graph)", name);
  return g.value(g.inputs.at(0));
}

// The two phases' FLOPs, bytes and predicted seconds on `device`. The
// setup's kernels (what the parameters and constants alone give, run once
// after the weights load) belong to neither.
void phases(const ir::Graph& g, const Device& device, InferencePhase& prefill, InferencePhase& decode,
            ir::DType* matmul_dtype = nullptr) {
  const StepCost cost = analyze_step(g, &device);
  const StepTime time = predict_step_time(g, cost, device);
  if (matmul_dtype) *matmul_dtype = cost.matmul_dtype;
  for (const KernelTime& k : time.kernels) {
    if (k.phase == ir::Phase::Setup) continue;
    InferencePhase& p = k.phase == ir::Phase::Decode ? decode : prefill;
    p.flops += k.flops;
    p.bytes += k.bytes;
    if (!k.no_peak) p.seconds += k.seconds;
  }
}

}  // namespace

InferenceCost analyze_inference(const ir::Graph& g, const ir::Graph& doubled, const Device& device) {
  InferenceCost c;
  const ir::TensorType& tokens = named_input(g, "prefill.tokens").type;
  c.batch = tokens.dims.at(0).size;
  c.context = tokens.dims.at(1).size;
  c.vocab = g.value(g.find_output("decode.logits")).type.dims.back().size;
  c.layers = static_cast<int>(g.state.size() / 2);  // a key and a value cache per attention
  for (const ir::Param& p : g.params) {
    c.params += g.value(p.value).type.numel();
    c.param_bytes += static_cast<double>(g.value(p.value).type.bytes());
  }
  for (ir::ValueId s : g.state) c.kv_bytes += static_cast<double>(g.value(s).type.bytes());
  c.kv_bytes_per_sequence = c.kv_bytes / static_cast<double>(c.batch);
  c.kv_bytes_per_token = c.kv_bytes_per_sequence / static_cast<double>(c.context);

  c.device = &device;
  phases(g, device, c.prefill, c.decode, &c.matmul_dtype);
  c.prefill.tokens = static_cast<double>(c.batch * c.context);
  c.decode.tokens = static_cast<double>(c.batch);
  c.ridge = device.bandwidth_bytes_per_s > 0 ? matmul_peak(device, c.matmul_dtype) / device.bandwidth_bytes_per_s : 0;

  InferencePhase prefill2, decode2;
  phases(doubled, device, prefill2, decode2);
  const double b = static_cast<double>(c.batch);
  c.decode_flops_per_sequence = c.decode.flops / b;
  c.decode_bytes_per_sequence = (decode2.bytes - c.decode.bytes) / b;
  c.decode_weight_bytes = c.decode.bytes - b * c.decode_bytes_per_sequence;
  // b·F / (W + b·S) >= ridge  <=>  b (F - ridge·S) >= ridge·W.
  const double margin = c.decode_flops_per_sequence - c.ridge * c.decode_bytes_per_sequence;
  if (c.ridge > 0 && margin > 0) c.compute_bound_batch = std::ceil(c.ridge * c.decode_weight_bytes / margin);
  return c;
}

}  // namespace napkin::analysis
