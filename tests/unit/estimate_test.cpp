#include "analysis/estimate.h"

#include <doctest/doctest.h>

#include <string>

#include "analysis/devices.h"

namespace analysis = napkin::analysis;

// CS336 lecture 2: 70B params on 15T tokens, 1024 H100s at bf16, MFU 0.5.
TEST_CASE("training a 70B model on 15T tokens takes about 144 days") {
  const double peak = analysis::matmul_peak(*analysis::find_device("h100"), napkin::ir::DType::BF16);
  const auto t = analysis::training_time(70e9, 15e12, 1024, peak, 0.5);
  REQUIRE(t);
  CHECK(t.value->flops == doctest::Approx(6.3e24));
  CHECK(t.value->flops == analysis::training_flops(70e9, 15e12));
  CHECK(t.value->days == doctest::Approx(143.9).epsilon(1e-3));
  CHECK(t.value->seconds == doctest::Approx(t.value->days * 86400));
}

TEST_CASE("training_time rejects impossible inputs") {
  CHECK_FALSE(analysis::training_time(1e9, 1e9, 0, 1e12, 0.5));
  CHECK_FALSE(analysis::training_time(1e9, 1e9, 8, 0, 0.5));  // e.g. fp8 on an A100
  CHECK_FALSE(analysis::training_time(1e9, 1e9, 8, 1e12, 0));
  const auto bad = analysis::training_time(1e9, 1e9, 8, 1e12, 1.5);
  CHECK_FALSE(bad);
  CHECK(bad.error.find("MFU") != std::string::npos);
}

TEST_CASE("bytes per parameter by component") {
  const auto fp32 = analysis::bytes_per_param("adamw", "fp32");
  REQUIRE(fp32);
  CHECK(fp32.value->params == 4);
  CHECK(fp32.value->grads == 4);
  CHECK(fp32.value->optimizer_state == 8);
  CHECK(fp32.value->total == 16);
  const auto bf16 = analysis::bytes_per_param("AdamW", "bf16-mixed");
  REQUIRE(bf16);
  CHECK(bf16.value->params == 2);
  CHECK(bf16.value->total == 12);
  CHECK(analysis::bytes_per_param("sgd", "fp32").value->total == 8);
  CHECK(analysis::bytes_per_param("momentum", "fp16-mixed").value->total == 8);
  CHECK(analysis::bytes_per_param("adagrad", "fp32").value->optimizer_state == 4);
  CHECK(analysis::bytes_per_param("rmsprop", "fp32").value->optimizer_state == 4);
  CHECK(analysis::bytes_per_param("adam", "fp8-mixed").value->total == 12);
}

TEST_CASE("unknown optimizer or precision is an error listing the known names") {
  const auto opt = analysis::bytes_per_param("lion", "fp32");
  CHECK_FALSE(opt);
  CHECK(opt.error.find("lion") != std::string::npos);
  CHECK(opt.error.find(analysis::known_optimizer_names()) != std::string::npos);
  const auto prec = analysis::bytes_per_param("adamw", "int4");
  CHECK_FALSE(prec);
  CHECK(prec.error.find(analysis::known_precision_names()) != std::string::npos);
  CHECK(analysis::known_optimizer_names() == "sgd, momentum, adagrad, rmsprop, adam, adamw");
  CHECK(analysis::known_precision_names() == "fp32, bf16-mixed, fp16-mixed, fp8-mixed");
}

// CS336 lecture 2: the largest model AdamW can train on 8 H100s.
TEST_CASE("largest trainable model on 8 H100s") {
  const double memory = analysis::find_device("h100")->memory_bytes;
  CHECK(analysis::max_trainable_params(8, memory, *analysis::bytes_per_param("adamw", "fp32").value) == 40e9);
  CHECK(analysis::max_trainable_params(8, memory, *analysis::bytes_per_param("adamw", "bf16-mixed").value) ==
        doctest::Approx(53.3e9).epsilon(1e-3));
}
