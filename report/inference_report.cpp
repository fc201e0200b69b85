#include "report/inference_report.h"

#include <fmt/format.h>

#include <cmath>

#include "ir/quantities.h"

namespace napkin::report {

namespace {

std::string bound(double intensity, double ridge) {
  if (ridge <= 0) return "no peak for its dtype";
  return intensity >= ridge ? "compute-bound" : "memory-bound";
}

std::string phase_line(const char* name, const analysis::InferencePhase& p, double ridge, const std::string& per) {
  return fmt::format("  {:<13}{} ({}), {} moved, {:.1f} FLOP/byte ({}): {} predicted, {} tok/s\n", name,
                     ir::human_flops(p.flops), per, ir::human_bytes(p.bytes), p.intensity(), bound(p.intensity(), ridge),
                     p.seconds > 0 ? ir::human_seconds(p.seconds) : std::string("no time"),
                     ir::with_commas(std::round(p.tokens_per_second())));
}

}  // namespace

std::string inference_section_text(const std::string& model, const analysis::InferenceCost& c, int64_t kv_heads,
                                   int64_t head_dim, int64_t kv_element_bytes) {
  std::string out = fmt::format(
      "\ninference ({}: a prefill of the whole context, then one token a step against a KV cache, as `napkin sample` "
      "runs it; docs/report.md#inference)\n",
      model);
  out += fmt::format("  batch {}, context {} tokens, vocab {}, {} attention layers; device {}\n", c.batch, c.context,
                     c.vocab, c.layers, c.device ? c.device->name : std::string("none"));
  out += fmt::format("  parameters   {} ({} as stored; a mixed-precision policy's casts of them are made once, by the "
                     "setup, before any prefill or decode step)\n",
                     ir::with_commas(static_cast<double>(c.params)), ir::human_bytes(c.param_bytes));
  out += fmt::format("  KV cache     {} per sequence = 2 (k, v) x {} layers x {} tokens x {} (kv_heads {} x head_dim {}) "
                     "x {} bytes; {} per token; {} for the batch\n",
                     ir::human_bytes(c.kv_bytes_per_sequence), c.layers, c.context, kv_heads * head_dim, kv_heads,
                     head_dim, kv_element_bytes, ir::human_bytes(c.kv_bytes_per_token), ir::human_bytes(c.kv_bytes));
  out += phase_line("prefill", c.prefill, c.ridge, fmt::format("{} tokens", ir::with_commas(c.prefill.tokens)));
  out += phase_line("decode step", c.decode, c.ridge,
                    fmt::format("{} per token, attention over the whole cache",
                                ir::human_flops(c.decode_flops_per_sequence)));
  out += fmt::format("  roofline     ridge {:.1f} FLOP/byte ({} matmul peak / main-memory bandwidth)\n", c.ridge,
                     ir::dtype_name(c.matmul_dtype));
  out += fmt::format("  decode       a step moves {} of weights whatever the batch, and {} per sequence; ",
                     ir::human_bytes(c.decode_weight_bytes), ir::human_bytes(c.decode_bytes_per_sequence));
  if (std::isinf(c.compute_bound_batch))
    out += "it stays memory-bound at any batch (each sequence's own bytes outweigh its FLOPs)\n";
  else
    out += fmt::format("compute-bound from batch {}\n", ir::with_commas(c.compute_bound_batch));
  return out;
}

nlohmann::json inference_json(const analysis::InferenceCost& c) {
  auto phase = [](const analysis::InferencePhase& p) {
    return nlohmann::json{{"flops", p.flops},      {"bytes", p.bytes},   {"intensity", p.intensity()},
                          {"seconds", p.seconds},  {"tokens", p.tokens}, {"tokens_per_s", p.tokens_per_second()}};
  };
  return {{"batch", c.batch},
          {"context", c.context},
          {"vocab", c.vocab},
          {"layers", c.layers},
          {"params", c.params},
          {"param_bytes", c.param_bytes},
          {"kv_bytes", c.kv_bytes},
          {"kv_bytes_per_sequence", c.kv_bytes_per_sequence},
          {"kv_bytes_per_token", c.kv_bytes_per_token},
          {"prefill", phase(c.prefill)},
          {"decode", phase(c.decode)},
          {"device", c.device ? c.device->name : ""},
          {"ridge", c.ridge},
          {"decode_flops_per_sequence", c.decode_flops_per_sequence},
          {"decode_weight_bytes", c.decode_weight_bytes},
          {"decode_bytes_per_sequence", c.decode_bytes_per_sequence},
          {"compute_bound_batch", std::isinf(c.compute_bound_batch) ? nlohmann::json(nullptr)
                                                                    : nlohmann::json(c.compute_bound_batch)}};
}

}  // namespace napkin::report
