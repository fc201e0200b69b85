// Data-parallel training on this machine (docs/distributed.md): CPU trainers
// launched by Open MPI's mpirun on 2 and 4 ranks (oversubscribed, over
// loopback and shared memory) train as one process with the whole batch,
// gradient accumulation in one process trains so too, a job is reproducible
// bit for bit, resumes on another rank count, and ends with a message when a
// rank dies or hangs, its last checkpoint intact.
//
// The reference of every comparison is the same model run as one process
// with the global batch (batch=4) or its micro-batch (batch=2): the mean of
// the micro-batches' mean losses is the global batch's mean loss, and its
// gradient the mean of their gradients, so the losses agree to f32 rounding
// (the sums are ordered differently).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/checkpoint.h"
#include "support/data_parallel_jobs.h"
#include "support/test_io.h"

namespace {

using namespace napkin::testing::data_parallel;
using napkin::testing::read_bytes;
using napkin::testing::write_bytes;

}  // namespace

TEST_CASE("data parallel: 2 ranks of B/2 and one process accumulating 2 × B/2 train as one process of B") {
  Fixture f("sgd(lr=0.5, momentum=0.9)");
  const std::string steps = "--steps 20 --checkpoint-every 0 --quiet";
  Run whole = f.train("", f.whole, steps, "whole");
  Run accumulated = f.train("", f.micro, steps + " --accumulate 2", "accumulated");
  Run ranks = f.train(mpirun(2), f.micro, steps, "ranks2");
  INFO(whole.out << accumulated.out << ranks.out);
  REQUIRE(whole.status == 0);
  REQUIRE(accumulated.status == 0);
  REQUIRE(ranks.status == 0);
  REQUIRE(f.losses("whole").size() == 20);
  check_losses_agree(f.losses("accumulated"), f.losses("whole"), kF32Agreement);
  check_losses_agree(f.losses("ranks2"), f.losses("whole"), kF32Agreement);
  // The loss is no constant: the test would see a model that did not train.
  CHECK(f.losses("whole").back().second < f.losses("whole").front().second - 0.1);
}

TEST_CASE("data parallel: fp16-mixed's loss scale skips and backs off together on every rank") {
  // A scale of 2^20 overflows f16 at first: steps are skipped and the scale halves until it fits. found_inf
  // reads the averaged gradients, so 2 ranks skip together, exactly as one process accumulating the same two
  // micro-batches (the same f32 sums). Not as one process with the whole batch: a micro-batch's scaled
  // gradients are larger per row (the mean over fewer rows), so it overflows at another scale, as
  // GradScaler's do under DDP.
  Fixture f("", "{policy: fp16-mixed, loss_scale: {init: 1048576}}");
  const std::string steps = "--steps 12 --checkpoint-every 0 --quiet";
  Run ranks = f.train(mpirun(2), f.micro, steps, "ranks16");
  Run accumulated = f.train("", f.micro, steps + " --accumulate 2", "accumulated16");
  INFO(ranks.out << accumulated.out);
  REQUIRE(ranks.status == 0);
  REQUIRE(accumulated.status == 0);
  REQUIRE(f.losses("ranks16").size() == 12);
  CHECK(f.losses("ranks16") == f.losses("accumulated16"));
  CHECK(f.losses("ranks16").back().second < f.losses("ranks16").front().second);
}

TEST_CASE("data parallel: two 2-rank runs are bit-identical - 4 ranks × B/2 match one process accumulating 4") {
  Fixture f;
  Run a = f.train(mpirun(2), f.micro, fmt::format("--steps 12 --quiet --checkpoint-dir {}", f.tmp / "a"), "a");
  Run b = f.train(mpirun(2), f.micro, fmt::format("--steps 12 --quiet --checkpoint-dir {}", f.tmp / "b"), "b");
  INFO(a.out << b.out);
  REQUIRE(a.status == 0);
  REQUIRE(b.status == 0);
  CHECK(f.losses("a") == f.losses("b"));
  CHECK(checkpoint_data(f.tmp / "a/step-000012.safetensors") == checkpoint_data(f.tmp / "b/step-000012.safetensors"));
  Run four = f.train(mpirun(4), f.micro, "--steps 12 --quiet --checkpoint-every 0", "four");
  Run one = f.train("", f.micro, "--steps 12 --quiet --checkpoint-every 0 --accumulate 4", "one");
  INFO(four.out << one.out);
  REQUIRE(four.status == 0);
  REQUIRE(one.status == 0);
  check_losses_agree(f.losses("four"), f.losses("one"), kF32Agreement);
}

TEST_CASE("data parallel: a 2-rank checkpoint resumes on 4 ranks with the same global batch, and refuses another") {
  Fixture f;
  const std::string dir = f.tmp / "ckpt";
  // 2 ranks × 2 accumulated, then 4 ranks × 1: 4 micro-batches of 2 rows per step throughout.
  Run uninterrupted = f.train(mpirun(2), f.micro, "--steps 16 --quiet --checkpoint-every 0 --accumulate 2", "straight");
  Run first = f.train(mpirun(2), f.micro, fmt::format("--steps 8 --quiet --accumulate 2 --checkpoint-dir {}", dir),
                      "first");
  INFO(uninterrupted.out << first.out);
  REQUIRE(uninterrupted.status == 0);
  REQUIRE(first.status == 0);
  Run second = f.train(mpirun(4), f.micro, fmt::format("--steps 16 --quiet --resume {}", dir), "second");
  INFO(second.out);
  REQUIRE(second.status == 0);
  check_losses_agree(f.resumed_losses("first", "second"), f.losses("straight"), kF32Agreement);

  // Another global batch (4 ranks × 2) is another run: refused, with the flag that continues this one.
  Run other = f.train(mpirun(4), f.micro, fmt::format("--steps 20 --quiet --accumulate 2 --resume {}", dir), "other");
  INFO(other.out);
  CHECK(other.status != 0);
  CHECK(other.out.find("was written by a run of 4 micro-batches per step") != std::string::npos);
  CHECK(other.out.find("pass --accumulate 1 to continue it on 4 ranks") != std::string::npos);
  // ... and one process continues it with --accumulate 4.
  Run alone = f.train("", f.micro, fmt::format("--steps 17 --quiet --accumulate 4 --resume {}", dir), "alone");
  INFO(alone.out);
  CHECK(alone.status == 0);
}

TEST_CASE("data parallel: ZeRO-1 trains bit for bit as plain data parallel, and its checkpoint holds all the state") {
  Fixture f;
  // layers=1 GPT: the matrices' AdamW update is one batched kernel, the vectors' another: two shares.
  const std::string flags = "--steps 8 --quiet --checkpoint-every 4 --keep 0";
  for (int ranks : {2, 4}) {
    CAPTURE(ranks);
    const std::string plain_dir = f.tmp / fmt::format("plain{}", ranks), zero_dir = f.tmp / fmt::format("zero{}", ranks);
    Run plain = f.train(mpirun(ranks), f.micro, flags + " --checkpoint-dir " + plain_dir, fmt::format("plain{}", ranks));
    // The single format (a ZeRO job's default is sharded: tests/e2e/sharded_checkpoint_test.cpp).
    Run zero = f.train(mpirun(ranks), f.micro, flags + " --zero 1 --checkpoint-format single --checkpoint-dir " + zero_dir,
                       fmt::format("zero{}", ranks));
    INFO(plain.out << zero.out);
    REQUIRE(plain.status == 0);
    REQUIRE(zero.status == 0);
    CHECK(f.losses(fmt::format("zero{}", ranks)) == f.losses(fmt::format("plain{}", ranks)));
    // Rank 0 gathered the other ranks' optimizer state before writing: the same tensors, byte for byte.
    for (const char* step : {"step-000004.safetensors", "step-000008.safetensors"})
      CHECK(checkpoint_data(zero_dir + "/" + step) == checkpoint_data(plain_dir + "/" + step));
  }
  // The banner says what rank 0 owns.
  Run shown = f.train(mpirun(2), f.micro, "--steps 1 --checkpoint-every 0 --zero 1", "shown");
  INFO(shown.out);
  CHECK(shown.out.find("ZeRO-1     rank 0 updates ") != std::string::npos);
  // A ZeRO-1 checkpoint resumes without ZeRO (and on another rank count), as the same run.
  Run resumed = f.train(mpirun(4), f.micro, fmt::format("--steps 8 --quiet --accumulate 1 --resume {}/step-000004.safetensors "
                                                        "--checkpoint-dir {}", f.tmp / "zero4", f.tmp / "resumed"),
                        "resumed");
  INFO(resumed.out);
  REQUIRE(resumed.status == 0);
  CHECK(checkpoint_data(f.tmp / "resumed/step-000008.safetensors") == checkpoint_data(f.tmp / "plain4/step-000008.safetensors"));
}

// ZeRO-2 sums the micro-batches after the ranks (each micro-batch's gradients are reduce-scattered, then added),
// plain data parallel before them, and adds each rank's part of the clipping norm and of fp16's overflow probe
// in another order: the same training to f32 rounding, compounding over the steps. The worst seen on this
// machine was 4.4e-8 (20 steps of models/gpt.yaml's AdamW, 2 ranks); with the ranks' norm parts not summed (each
// rank clipping by its own) the losses part by 1e-4 to 5e-4.
constexpr double kZero2Agreement = 1e-6;

// ZeRO-2 on `ranks` ranks × `accumulate` against plain data parallel of the same split: the losses agree.
void check_zero2_trains_as_plain(const Fixture& f, int ranks, int accumulate, const std::string& steps) {
  CAPTURE(ranks);
  CAPTURE(accumulate);
  const std::string name = fmt::format("{}x{}", ranks, accumulate);
  const std::string flags = fmt::format("{} --checkpoint-every 0 --quiet --accumulate {}", steps, accumulate);
  Run plain = f.train(mpirun(ranks), f.micro, flags, "plain" + name);
  Run zero = f.train(mpirun(ranks), f.micro, flags + " --zero 2", "zero" + name);
  INFO(plain.out << zero.out);
  REQUIRE(plain.status == 0);
  REQUIRE(zero.status == 0);
  check_losses_agree(f.losses("zero" + name), f.losses("plain" + name), kZero2Agreement);
}

TEST_CASE("data parallel: ZeRO-2 trains as plain data parallel on 2 and 4 ranks, accumulating or not (issue 40)") {
  // models/gpt.yaml's AdamW clips the global gradient norm at 1.0: each rank sums its own gradients' squares, the
  // program's all_reduce_sum adds the ranks' parts. The first steps' gradients are larger than 1, so the clip acts.
  Fixture f;
  for (int ranks : {2, 4})
    for (int accumulate : {1, 2}) check_zero2_trains_as_plain(f, ranks, accumulate, "--steps 20");
  // The loss falls: a rank that updated with a wrong norm (or none) would not train as plain does.
  CHECK(f.losses("zero2x1").back().second < f.losses("zero2x1").front().second - 0.1);

  // Buckets: 2 ranks add two numbers in either order to the same bits, so many small reduce-scatters train
  // exactly as one.
  Run one = f.train(mpirun(2), f.micro, "--steps 8 --checkpoint-every 0 --zero 2", "one_bucket");
  Run many = f.train(mpirun(2), f.micro, "--steps 8 --checkpoint-every 0 --quiet --zero 2 --bucket-mib 0.01", "buckets");
  INFO(one.out << many.out);
  REQUIRE(one.status == 0);
  REQUIRE(many.status == 0);
  CHECK(one.out.find("ZeRO-2     rank 0 updates ") != std::string::npos);
  CHECK(one.out.find("reduce-scattered by MPI on the host after each micro-batch's backward, in 1 bucket ") !=
        std::string::npos);
  CHECK(one.out.find("reduce-scatter: ") != std::string::npos);
  CHECK(f.losses("buckets") == f.losses("one_bucket"));
}

TEST_CASE("data parallel: ZeRO-2 under bf16-mixed, and fp16-mixed's overflow skips on every rank together (issue 40)") {
  Fixture bf16("", "bf16-mixed");
  check_zero2_trains_as_plain(bf16, 2, 1, "--steps 12");
  // A scale of 2^20 overflows f16 at first: each rank's overflow probe sees only its own parameters' gradients,
  // the all_reduce_sum makes its NaN every rank's, and all skip the same steps as plain data parallel (a rank
  // that updated alone would part from the others' weights, and its loss from plain's).
  Fixture fp16("", "{policy: fp16-mixed, loss_scale: {init: 1048576}}");
  check_zero2_trains_as_plain(fp16, 2, 1, "--steps 12");
  check_zero2_trains_as_plain(fp16, 4, 1, "--steps 12");
}

TEST_CASE("data parallel: a ZeRO-2 checkpoint holds the whole run and resumes on another rank count (issue 40)") {
  Fixture f;
  const std::string dir = f.tmp / "ckpt";
  // 2 ranks × 2 accumulated, then 4 ranks × 1 and one process × 4: 4 micro-batches per step throughout.
  Run straight = f.train(mpirun(2), f.micro, "--steps 12 --quiet --checkpoint-every 0 --accumulate 2 --zero 2", "straight");
  Run first = f.train(mpirun(2), f.micro,
                      fmt::format("--steps 6 --quiet --accumulate 2 --zero 2 --checkpoint-dir {}", dir), "first");
  INFO(straight.out << first.out);
  REQUIRE(straight.status == 0);
  REQUIRE(first.status == 0);
  Run four = f.train(mpirun(4), f.micro, fmt::format("--steps 12 --quiet --zero 2 --resume {}", dir), "four");
  Run alone = f.train("", f.micro, fmt::format("--steps 12 --quiet --accumulate 4 --resume {}/step-000006.sharded "
                                               "--checkpoint-dir {}", dir, f.tmp / "alone"), "alone");
  INFO(four.out << alone.out);
  REQUIRE(four.status == 0);
  REQUIRE(alone.status == 0);
  for (const char* resumed : {"four", "alone"}) {
    CAPTURE(resumed);
    check_losses_agree(f.resumed_losses("first", resumed), f.losses("straight"), kZero2Agreement);
  }
}

TEST_CASE("data parallel: ranks that disagree on --seed, --accumulate or their data stop before step 1, naming the rank and the setting (issue 36 item 2)") {
  Fixture f;
  // 20,000 bytes of the token file: a shorter copy on rank 1's host.
  const std::string shorter = f.tmp / "short.u16";
  write_bytes(shorter, read_bytes(napkin::testing::source_path("tests/e2e/data/gpt/tokens.u16")).substr(0, 20000));
  const std::string common = "--threads 1 --steps 3 --checkpoint-every 0";
  struct Case {
    std::string rank0, rank1, says;
  };
  for (const Case& c : std::vector<Case>{
           {"--seed 1", "--seed 2", "rank 1 disagrees with rank 0 on --seed: 2 vs 1"},
           {"--accumulate 1", "--accumulate 2", "rank 1 disagrees with rank 0 on --accumulate: 2 vs 1"},
           {"", "", "rank 1 disagrees with rank 0 on the data: 20,000 bytes, CRC-32C "},
       }) {
    CAPTURE(c.says);
    const std::string data1 = c.says.find("the data") != std::string::npos ? shorter : "tests/e2e/data/gpt/tokens.u16";
    // mpirun's MPMD form: one rank with each command line.
    Run r = sh(fmt::format("{} -np 1 {} --data tests/e2e/data/gpt/tokens.u16 {} --metrics {} {} : -np 1 {} --data {} {} {}",
                           mpirun_launcher(), f.micro, common, f.tmp / "m.jsonl", c.rank0, f.micro, data1, common,
                           c.rank1));
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(r.out.find("error: " + c.says) != std::string::npos);
    CHECK(r.out.find("error: " + c.says, r.out.find("error: " + c.says) + 1) == std::string::npos);  // rank 0 alone says it
    CHECK(r.out.find("step      1/3") == std::string::npos);
    CHECK(!std::filesystem::exists(f.tmp / "m.jsonl"));  // nothing trained, no metrics
  }
}

// A job whose rank 1 is killed (kill -9) or stopped (SIGSTOP: a hang the
// launcher cannot see) after its 4th checkpoint: the job ends within 30 s,
// with a message naming the rank and step, and the newest checkpoint loads.
void check_failure_ends_the_job(const char* signal, const char* expected) {
  Fixture f;
  const std::string dir = f.tmp / "ckpt", log = f.tmp / "log";
  // The script prints the seconds from the signal to mpirun's exit, and its status.
  std::string script = fmt::format(
      "{} {} {} --steps 1000000 --quiet --checkpoint-every 10 --keep 0 --checkpoint-dir {} --collective-timeout 5 "
      "> {} 2>&1 &\n"
      "launcher=$!\n"
      "for i in $(seq 600); do [ -e {}/step-000040.safetensors ] && break; sleep 0.1; done\n"
      "victim=''\n"
      "for p in $(pgrep -P $launcher); do grep -qz '^OMPI_COMM_WORLD_RANK=1$' /proc/$p/environ && victim=$p; done\n"
      "[ -n \"$victim\" ] || {{ echo 'no rank 1 under mpirun'; kill $launcher; exit 3; }}\n"
      "start=$(date +%s%N); kill -{} $victim; wait $launcher; status=$?; end=$(date +%s%N)\n"
      "echo \"status $status seconds $(( (end - start) / 1000000000 ))\"\n",
      mpirun(2), f.micro, kData, dir, log, dir, signal);
  Run r = sh(script);
  std::string out = read_bytes(log);
  INFO(r.out << out);
  REQUIRE(r.status == 0);
  int status = -1, seconds = -1;
  REQUIRE(std::sscanf(r.out.c_str(), "status %d seconds %d", &status, &seconds) == 2);
  CHECK(status != 0);
  CHECK(seconds < 30);
  CHECK(out.find(expected) != std::string::npos);
  CHECK(out.find("error: rank 0 of 2, step ") != std::string::npos);
  // Every checkpoint left is whole: the newest verifies and holds its step.
  auto all = napkin::runtime::list_checkpoints(dir);
  REQUIRE(all.size() >= 4);
  CHECK(napkin::runtime::read_checkpoint_header(all.front().second).step == all.front().first);
  for (const auto& [step, path] : all) CHECK_NOTHROW(napkin::runtime::verify_checkpoint(path, napkin::runtime::read_checkpoint_header(path).model_hash));
  // ... and the job resumes from the newest.
  Run resumed = sh(fmt::format("{} {} {} --steps {} --quiet --resume {}", mpirun(2), f.micro, kData,
                               all.front().first + 2, dir));
  INFO(resumed.out);
  CHECK(resumed.status == 0);
  CHECK(napkin::runtime::list_checkpoints(dir).front().first == all.front().first + 2);
}

TEST_CASE("data parallel: a killed rank ends the job within 30 s, naming it, the last checkpoint intact") {
  check_failure_ends_the_job("9", "process rank 1");
}

TEST_CASE("data parallel: a hung rank ends the job after --collective-timeout, naming the step") {
  check_failure_ends_the_job("STOP", "(--collective-timeout 5): one of them hung or died");
}
