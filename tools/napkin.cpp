// The napkin driver: one subcommand per thing a user does.
//
//   napkin report MODEL.yaml [--device h100] [--json]   the static resource report
//   napkin ir MODEL.yaml [--print-after PASS]           the IR as text
//   napkin estimate --params 70e9 --tokens 15e12 ...    the lecture's napkin math
//   napkin devices                                      the device table
//   napkin ops                                          the op table
//
// Exit status: 0 success, 1 a user error (bad model, bad flag), 2 an internal
// error (a bug in napkin, reported with the compiler's file:line).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "frontend/frontend.h"
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

// Loads a model and runs the forward pipeline; prints diagnostics (warnings too).
std::optional<ir::Graph> load(const std::string& path, const passes::PipelineOptions& options = {}) {
  ir::Diagnostics diag;
  std::optional<ir::Graph> g = frontend::load_model_file(path, diag);
  if (g) passes::run_forward_pipeline(*g, diag, options);
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

int cmd_report(const std::string& path, const std::string& device_name, bool json, bool no_ops) {
  const passes::Device* device = device_or_error(device_name);
  auto g = load(path);
  if (!g) return kUserError;
  passes::ForwardCost cost = passes::analyze_forward(*g, device);
  passes::ReportOptions options{path, !no_ops};
  std::cout << (json ? passes::render_report_json(*g, cost, options) : passes::render_report_text(*g, cost, options));
  return 0;
}

int cmd_ir(const std::string& path, const std::vector<std::string>& print_after, bool time_passes, bool no_locations) {
  passes::PipelineOptions options{print_after, time_passes, &std::cout};
  auto g = load(path, options);
  if (!g) return kUserError;
  if (print_after.empty()) std::cout << ir::print_graph(*g, {!no_locations});
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
    auto g = load(a.model);
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

  std::string model, device;
  bool json = false, no_ops = false;
  auto* report = app.add_subcommand("report", "print the static resource report of a model");
  report->add_option("model", model, "model YAML file")->required();
  report->add_option("--device", device, "add roofline times for a device (see napkin devices)");
  report->add_flag("--json", json, "print one JSON object");
  report->add_flag("--no-ops", no_ops, "omit the per-op table");
  report->callback([&] { status = cmd_report(model, device, json, no_ops); });

  std::vector<std::string> print_after;
  bool time_passes = false, no_locations = false;
  auto* ir_cmd = app.add_subcommand("ir", "print the IR of a model");
  ir_cmd->add_option("model", model, "model YAML file")->required();
  ir_cmd->add_option("--print-after", print_after, "print the IR after these passes ('all' for every pass)");
  ir_cmd->add_flag("--time-passes", time_passes, "time each pass");
  ir_cmd->add_flag("--no-locations", no_locations, "omit the YAML locations");
  ir_cmd->callback([&] { status = cmd_ir(model, print_after, time_passes, no_locations); });

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
