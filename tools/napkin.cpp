// The napkin driver: one subcommand per thing a user does.
//
//   napkin report MODEL.yaml [--device h100] [--json]   the static resource report of a training step
//   napkin ir MODEL.yaml [--print-after PASS]           the IR as text
//   napkin check MODEL.yaml [--dims d=32,layers=2]      gradients vs float64 finite differences
//   napkin estimate --params 70e9 --tokens 15e12 ...    the lecture's napkin math
//   napkin devices                                      the device table
//   napkin ops                                          the op table
//
// Exit status: 0 success, 1 a user error (bad model, bad flag), 2 an internal
// error (a bug in napkin, reported with the compiler's file:line).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "frontend/frontend.h"
#include "interp/gradient_check.h"
#include "ir/internal_check.h"
#include "ir/printer.h"
#include "passes/cost.h"
#include "passes/devices.h"
#include "passes/estimate.h"
#include "passes/pipeline.h"
#include "passes/report.h"

namespace {

using namespace napkin;

constexpr int kUserError = 1;
constexpr int kInternalError = 2;

// Loads a model and builds its training step (forward, backward, optimizer);
// prints diagnostics (warnings too).
std::optional<ir::Graph> load(const std::string& path, const std::string& dims,
                              const passes::PipelineOptions& options = {}) {
  frontend::LoadOptions load_options;
  if (!dims.empty()) {
    std::string error;
    auto overrides = frontend::parse_dim_overrides(dims, error);
    if (!overrides) {
      std::cerr << fmt::format("error: --dims: {}\n    hint: write --dims name=value,name=value, e.g. --dims d=32,layers=2\n", error);
      return std::nullopt;
    }
    load_options.dim_overrides = *overrides;
  }
  ir::Diagnostics diag;
  std::optional<ir::Graph> g = frontend::load_model_file(path, diag, load_options);
  if (g) passes::run_training_pipeline(*g, diag, options);
  std::cerr << diag.render();
  if (diag.has_errors()) return std::nullopt;
  return g;
}

const passes::Device* device_or_error(const std::string& name) {
  if (name.empty()) return nullptr;
  const passes::Device* d = passes::find_device(name);
  if (!d) {
    std::cerr << fmt::format("error: unknown device '{}'\n    hint: known devices: {} (napkin devices lists them)\n", name,
                             passes::known_device_names());
    throw CLI::RuntimeError(kUserError);
  }
  return d;
}

int cmd_report(const std::string& path, const std::string& dims, const std::string& device_name, bool json, bool no_ops) {
  const passes::Device* device = device_or_error(device_name);
  auto g = load(path, dims);
  if (!g) return kUserError;
  passes::StepCost cost = passes::analyze_step(*g, device);
  passes::MemoryReport memory = passes::analyze_memory(*g);
  passes::ReportOptions options{path, !no_ops};
  std::cout << (json ? passes::render_report_json(*g, cost, memory, options)
                     : passes::render_report_text(*g, cost, memory, options));
  return 0;
}

int cmd_ir(const std::string& path, const std::string& dims, const std::vector<std::string>& print_after, bool time_passes,
           bool no_locations) {
  passes::PipelineOptions options{print_after, time_passes, &std::cout};
  auto g = load(path, dims, options);
  if (!g) return kUserError;
  if (print_after.empty()) std::cout << ir::print_graph(*g, {!no_locations});
  return 0;
}

// The float64 interpreter does about 1e9 FLOP/s; a check is ~2 forward passes
// per checked element. Past this much work, ask for smaller dims instead of
// running for hours.
constexpr double kCheckFlopBudget = 2e10;

int cmd_check(const std::string& path, const std::string& dims, uint64_t seed, int samples, bool force) {
  auto g = load(path, dims);
  if (!g) return kUserError;
  passes::StepCost cost = passes::analyze_step(*g, nullptr);
  double forward = cost.phase(ir::Phase::Forward).flops;
  int tensors = 0;
  for (const auto& [label, v] : g->outputs) tensors += label.rfind("grad.", 0) == 0;
  double evaluations = 4.0 * (samples + 1) * tensors + 3;  // five-point stencils, plus the gradients themselves
  if (forward * evaluations > kCheckFlopBudget && !force) {
    std::cerr << fmt::format(
        "error: {}: checking {} gradients needs about {:.0f} forward passes of {} each in the float64 interpreter ({} in "
        "all: about {:.0f} minutes at ~1 GFLOP/s)\n    hint: check the same graph at smaller sizes with --dims, e.g. "
        "batch=2 and widths of 8 to 64 (the dims are at the top of the model file), or pass --force\n",
        path, tensors, evaluations, passes::human_flops(forward), passes::human_flops(forward * evaluations),
        forward * evaluations / 1e9 / 60);
    return kUserError;
  }
  interp::GradCheckOptions options;
  options.seed = seed;
  options.samples = samples;
  auto start = std::chrono::steady_clock::now();
  interp::GradCheckResult r;
  try {
    r = interp::check_gradients(*g, options);
  } catch (const std::runtime_error& e) {
    std::cerr << fmt::format("error: {}: {}\n", path, e.what());
    return kUserError;
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << fmt::format("napkin check: {} ({}{})\n", g->name, path, dims.empty() ? "" : ", dims " + dims);
  std::cout << fmt::format("gradients vs float64 central differences: seed {}, {} elements and one random direction per tensor\n",
                           seed, samples);
  std::cout << fmt::format("  {:<28} {:<20} {:>7}  {:>9} {:>7}  {:>9} {:>7}  {}\n", "parameter", "type", "checked", "f64 err",
                           "tol", "dtype err", "tol", "");
  int failed = 0;
  for (const interp::TensorCheck& t : r.tensors) {
    failed += !t.passed;
    std::cout << fmt::format("  {:<28} {:<20} {:>7}  {:>9.2e} {:>7.0e}  {:>9.2e} {:>7.0e}  {}\n", t.name,
                             fmt::format("{}[{}]", ir::dtype_name(t.type.dtype), fmt::join(t.type.sizes(), ",")),
                             t.elements_checked, t.max_error_f64, t.tolerance_f64, t.max_error_native, t.tolerance_native,
                             t.passed ? "ok" : "FAIL");
  }
  std::cout << fmt::format("loss {:.6g} at the check point; {} forward evaluations in {:.2f} s\n", r.loss,
                           r.forward_evaluations, seconds);
  if (r.tensors.empty()) {
    std::cout << "FAIL: no parameter has a gradient\n";
    return kUserError;
  }
  if (failed > 0) {
    std::cout << fmt::format("FAIL: {} of {} gradients disagree with finite differences\n", failed, r.tensors.size());
    return kUserError;
  }
  std::cout << (r.tensors.size() == 1 ? std::string("PASS: the gradient matches\n")
                                      : fmt::format("PASS: all {} gradients match\n", r.tensors.size()));
  return 0;
}

struct EstimateArgs {
  double params = 0;
  std::string model;
  double tokens = 0;
  int gpus = 1;
  std::string device = "h100";
  double mfu = 0.5;
  std::string dtype = "bf16";
  std::string optimizer;
  std::string precision;
};

int cmd_estimate(const EstimateArgs& a) {
  const passes::Device* device = device_or_error(a.device);
  double params = a.params;
  if (!a.model.empty()) {
    auto g = load(a.model, "");
    if (!g) return kUserError;
    params = static_cast<double>(g->param_count());
    std::cout << fmt::format("model {}: {} parameters\n", a.model, passes::with_commas(g->param_count()));
  }
  if (params <= 0 && a.tokens > 0) {
    std::cerr << "error: give --params N or --model FILE to estimate training time\n";
    return kUserError;
  }
  if (a.tokens <= 0 && a.optimizer.empty() && a.precision.empty()) {
    std::cerr << "error: nothing to estimate\n    hint: --tokens N for compute and time; --optimizer and --precision "
                 "for the largest model that fits\n";
    return kUserError;
  }
  if (a.tokens > 0) {
    auto dtype = ir::parse_dtype(a.dtype);
    if (!dtype) {
      std::cerr << fmt::format("error: unknown dtype '{}' (known: {})\n", a.dtype, ir::dtype_names_list());
      return kUserError;
    }
    double peak = passes::matmul_peak(*device, *dtype);
    auto t = passes::training_time(params, a.tokens, a.gpus, peak, a.mfu);
    if (!t) {
      std::cerr << "error: " << t.error << "\n";
      return kUserError;
    }
    std::cout << fmt::format(
        "training compute: 6 * {:.4g} params * {:.4g} tokens = {:.4g} FLOPs\n"
        "time on {} x {} at {} dense peak {:.4g} FLOP/s and MFU {}: {:.4g} s = {:.4g} hours = {:.1f} days\n",
        params, a.tokens, t.value->flops, a.gpus, device->name, ir::dtype_name(*dtype), peak, a.mfu,
        t.value->seconds, t.value->seconds / 3600, t.value->days);
  }
  if (!a.optimizer.empty() || !a.precision.empty()) {
    // Either flag alone takes the other's default.
    const std::string optimizer = a.optimizer.empty() ? "adamw" : a.optimizer;
    const std::string precision = a.precision.empty() ? "fp32" : a.precision;
    auto b = passes::bytes_per_param(optimizer, precision);
    if (!b) {
      std::cerr << "error: " << b.error << "\n";
      return kUserError;
    }
    const auto& bytes = *b.value;
    double largest = passes::max_trainable_params(a.gpus, device->memory_bytes, bytes);
    std::cout << fmt::format(
        "bytes per parameter ({}, {}): params {} + grads {} + optimizer state {} = {}\n"
        "largest model on {} x {} ({:.4g} bytes each), activations ignored: {:.4g} parameters\n",
        optimizer, precision, bytes.params, bytes.grads, bytes.optimizer_state, bytes.total, a.gpus, device->name,
        device->memory_bytes, largest);
    if (params > 0) {
      double need = params * bytes.total;
      std::cout << fmt::format("this model needs {:.4g} bytes = {}: {} on {} x {}\n", need, passes::human_bytes(need),
                               need <= a.gpus * device->memory_bytes ? "fits" : "does NOT fit", a.gpus, device->name);
    }
  }
  return 0;
}

int cmd_devices() {
  std::cout << fmt::format("device table v{} (dense peaks; FLOP/s)\n", passes::kDeviceTableVersion);
  std::cout << fmt::format("{:<6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10}  {}\n", "name", "fp32", "tf32",
                           "bf16", "fp16", "fp8", "bandwidth", "memory", "description");
  for (const passes::Device& d : passes::known_devices())
    std::cout << fmt::format("{:<6} {:>10.4g} {:>10.4g} {:>10.4g} {:>10.4g} {:>10.4g} {:>10.4g}/s {:>10.4g}  {}\n", d.name,
                             d.fp32_flops, d.tf32_flops, d.bf16_flops, d.fp16_flops, d.fp8_flops,
                             d.bandwidth_bytes_per_s, d.memory_bytes, d.description);
  return 0;
}

int cmd_ops() {
  std::cout << fmt::format("{:<20} {:>5}  {:<14} {:<13} {}\n", "op", "arity", "class", "FLOPs/element", "gradient");
  for (int i = 0; i < ir::kNumOps; ++i) {
    const ir::OpInfo& info = ir::op_info(static_cast<ir::Op>(i));
    std::cout << fmt::format("{:<20} {:>5}  {:<14} {:<13} {}\n", info.name,
                             info.arity < 0 ? "n" : std::to_string(info.arity), ir::op_class_name(info.op_class),
                             info.flops_per_element, info.vjp ? "vjp" : "none (backward-only)");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"napkin: a static graph compiler for training, with exact resource accounting"};
  app.require_subcommand(1);
  int status = 0;

  std::string model, device, dims;
  const char* dims_help = "override dims of the model, e.g. d=32,layers=2";
  bool json = false, no_ops = false;
  auto* report = app.add_subcommand("report", "print the static resource report of a training step");
  report->add_option("model", model, "model YAML file")->required();
  report->add_option("--dims", dims, dims_help);
  report->add_option("--device", device, "add roofline times for a device (see napkin devices)");
  report->add_flag("--json", json, "print one JSON object");
  report->add_flag("--no-ops", no_ops, "omit the per-op table");
  report->callback([&] { status = cmd_report(model, dims, device, json, no_ops); });

  std::vector<std::string> print_after;
  bool time_passes = false, no_locations = false;
  auto* ir_cmd = app.add_subcommand("ir", "print the IR of a model");
  ir_cmd->add_option("model", model, "model YAML file")->required();
  ir_cmd->add_option("--dims", dims, dims_help);
  ir_cmd->add_option("--print-after", print_after, "print the IR after these passes ('all' for every pass)");
  ir_cmd->add_flag("--time-passes", time_passes, "time each pass");
  ir_cmd->add_flag("--no-locations", no_locations, "omit the YAML locations");
  ir_cmd->callback([&] { status = cmd_ir(model, dims, print_after, time_passes, no_locations); });

  uint64_t seed = 0;
  int samples = 4;
  bool force = false;
  auto* check = app.add_subcommand("check", "check every parameter gradient against float64 finite differences");
  check->add_option("model", model, "model YAML file")->required();
  check->add_option("--dims", dims, dims_help);
  check->add_option("--seed", seed, "seed of the random inputs and parameters")->capture_default_str();
  check->add_option("--samples", samples, "elements per tensor checked one by one")->capture_default_str()->check(CLI::Range(0, 1000000));
  check->add_flag("--force", force, "run even when the check would take hours");
  check->callback([&] { status = cmd_check(model, dims, seed, samples, force); });

  EstimateArgs est;
  auto* estimate = app.add_subcommand("estimate", "napkin math: training compute, time and memory");
  estimate->add_option("--params", est.params, "parameter count, e.g. 70e9");
  estimate->add_option("--model", est.model, "a model YAML file instead of --params");
  estimate->add_option("--tokens", est.tokens, "training tokens, e.g. 15e12");
  estimate->add_option("--gpus", est.gpus, "number of devices")->capture_default_str();
  estimate->add_option("--device", est.device, "device (see napkin devices)")->capture_default_str();
  estimate->add_option("--mfu", est.mfu, "model FLOPs utilization in (0, 1]")->capture_default_str();
  estimate->add_option("--dtype", est.dtype, "compute dtype for the peak")->capture_default_str();
  estimate->add_option("--optimizer", est.optimizer, passes::known_optimizer_names());
  estimate->add_option("--precision", est.precision, passes::known_precision_names());
  estimate->callback([&] { status = cmd_estimate(est); });

  app.add_subcommand("devices", "list the device table")->callback([&] { status = cmd_devices(); });
  app.add_subcommand("ops", "list the op table")->callback([&] { status = cmd_ops(); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kUserError;
  } catch (const ir::InternalError& e) {
    std::cerr << e.what() << "\nthis is a bug in napkin, not in your model; please report it with the model file\n";
    return kInternalError;
  } catch (const std::exception& e) {
    std::cerr << "internal error: unexpected exception: " << e.what()
              << "\nthis is a bug in napkin, not in your model; please report it with the model file\n";
    return kInternalError;
  }
  return status;
}
