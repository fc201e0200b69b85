// The napkin driver end to end: exit codes, the lecture's estimates, and the
// report's JSON on a real model.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <string>

#include "support/test_io.h"

namespace {

using Run = napkin::testing::CommandResult;

Run run_napkin(const std::string& args) { return napkin::testing::run_in_source_tree(std::string(NAPKIN_BINARY) + " " + args); }

}  // namespace

TEST_CASE("estimate: 70B params on 15T tokens, 1024 H100s at MFU 0.5 takes about 144 days") {
  Run r = run_napkin("estimate --params 70e9 --tokens 15e12 --gpus 1024 --device h100 --mfu 0.5");
  CHECK(r.status == 0);
  CHECK(r.out.find("= 6.3e+24 FLOPs") != std::string::npos);
  CHECK(r.out.find("143.9 days") != std::string::npos);
}

TEST_CASE("estimate: the largest model on 8 H100s with AdamW in fp32 is 40e9 params at 16 bytes each") {
  Run r = run_napkin("estimate --gpus 8 --device h100 --optimizer adamw --precision fp32");
  CHECK(r.status == 0);
  CHECK(r.out.find("params 4 + grads 4 + optimizer state 8 = 16") != std::string::npos);
  CHECK(r.out.find("4e+10 parameters") != std::string::npos);
}

TEST_CASE("estimate: a model file stands in for --params") {
  Run r = run_napkin("estimate --model models/gpt2-124m.yaml --tokens 1e9");
  CHECK(r.status == 0);
  CHECK(r.out.find("124,439,808 parameters") != std::string::npos);
}

TEST_CASE("report --json on gpt2-124m") {
  Run r = run_napkin("report models/gpt2-124m.yaml --json --device h100");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["params"] == 124439808);
  CHECK(j["memory"]["params"] == int64_t{124439808} * 4);
  CHECK(j["flops"]["forward"].get<double>() > 2 * 8192 * 124439808.0);
  CHECK(j["bytes"]["forward"].get<double>() > 0);
  CHECK(j["ops"].size() > 12 * 20);
}

TEST_CASE("user errors exit 1 with a clear message") {
  Run unknown_device = run_napkin("report models/gpt.yaml --device tpu");
  CHECK(unknown_device.status == 1);
  CHECK(unknown_device.out.find("unknown device 'tpu'") != std::string::npos);
  CHECK(unknown_device.out.find("a100, cpu, h100, h200") != std::string::npos);

  Run missing = run_napkin("report models/no_such_model.yaml");
  CHECK(missing.status == 1);
  CHECK(missing.out.find("models/no_such_model.yaml: error: cannot open the model file") != std::string::npos);

  Run bad_flag = run_napkin("report models/gpt.yaml --no-such-flag");
  CHECK(bad_flag.status == 1);

  Run nothing = run_napkin("estimate --device h100");
  CHECK(nothing.status == 1);
  CHECK(nothing.out.find("nothing to estimate") != std::string::npos);
}

TEST_CASE("report refuses a FIFO - a device and a directory as the model at once") {
  // A FIFO with no writer used to block forever, and /dev/zero was read until
  // memory ran out: the timeout and the memory cap make either a failure here.
  napkin::testing::TempDir dir("driver-model");
  const std::string fifo = dir / "model.yaml";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto limited = [](const std::string& model) {
    return napkin::testing::run_in_source_tree("ulimit -v 8000000; timeout 60 " + std::string(NAPKIN_BINARY) +
                                               " report '" + model + "'");
  };
  Run from_fifo = limited(fifo);
  CHECK(from_fifo.status == 1);
  CHECK(from_fifo.out.find(fifo + ": error: the model path is a FIFO (a named pipe), not a file") != std::string::npos);
  Run zero = limited("/dev/zero");
  CHECK(zero.status == 1);
  CHECK(zero.out.find("/dev/zero: error: the model path is a character device, not a file") != std::string::npos);
  Run directory = limited("models");
  CHECK(directory.status == 1);
  CHECK(directory.out.find("models: error: the model path is a directory, not a file") != std::string::npos);
}

TEST_CASE("ir prints the graph with YAML locations - --print-after names the pass") {
  Run r = run_napkin("ir models/linear.yaml");
  CHECK(r.status == 0);
  CHECK(r.out.find("%pred = matmul(%x, %w) : f32[batch=1024, k=64]  # models/linear.yaml:19:13") != std::string::npos);
  Run after = run_napkin("ir models/linear.yaml --print-after dce --time-passes");
  CHECK(after.status == 0);
  CHECK(after.out.find("// IR after dce") != std::string::npos);
  CHECK(after.out.find("pass dce") != std::string::npos);
  Run typo = run_napkin("ir models/linear.yaml --print-after dcee");
  CHECK(typo.status == 1);
  CHECK(typo.out.find("--print-after: there is no pass 'dcee'") != std::string::npos);
}

TEST_CASE("report on a mixed-precision model: its warnings once, though the AMP audit builds an fp32 baseline too") {
  napkin::testing::TempDir dir("driver-warn");
  const std::string model = dir / "mixed.yaml";
  napkin::testing::write_bytes(model, R"yaml(
model: mixed
dims: {b: 4, d: 8}
inputs:
  x: {shape: [b, d]}
  y: {shape: [b, d]}
params:
  w: {shape: [d, d], init: normal(0.1)}
  unused: {shape: [d], init: zeros}
forward:
  - p: x @ w
loss: mse(p, y)
optimizer: sgd(lr=0.1)
precision: bf16-mixed
)yaml");
  Run r = run_napkin("report " + model + " --no-ops");
  CHECK(r.status == 0);
  const std::string warning = "warning: parameter 'unused' does not affect the loss";
  size_t first = r.out.find(warning);
  REQUIRE(first != std::string::npos);
  CHECK(r.out.find(warning, first + 1) == std::string::npos);
  CHECK(r.out.find("vs fp32") != std::string::npos);  // the baseline was built
}
