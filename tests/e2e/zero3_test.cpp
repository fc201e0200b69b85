// ZeRO-3 (docs/distributed.md): a trainer built with `napkin build --zero 3`
// gathers each parameter from its owner where its step uses it and reduces
// each gradient onto the owner. In one process its collectives are copies:
// it trains bit for bit as the trainer built without. On 2 and 4 ranks it
// trains as plain data parallelism of the same split does, to f32 rounding
// (the ranks' gradients are summed per micro-batch, then the micro-batches),
// under every precision policy, and its checkpoints resume on another rank
// count and in one process.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <string>
#include <vector>

#include "support/data_parallel_jobs.h"

namespace {

using namespace napkin::testing::data_parallel;

// The worst seen on this machine: 4.4e-8 over 20 steps of gpt.yaml's AdamW
// (2 and 4 ranks, --accumulate 1 and 2; the clipping norm's parts add in
// another order), 4.4e-8 under bf16-mixed on 4 ranks; fp16-mixed's skips
// agreed to the bit.
constexpr double kZero3Agreement = 1e-6;

// ZeRO-3 on `ranks` × `accumulate` against plain data parallel of the same split.
void check_zero3_trains_as_plain(const Fixture& f, const std::string& sharded, int ranks, int accumulate,
                                 const std::string& steps) {
  CAPTURE(ranks);
  CAPTURE(accumulate);
  const std::string name = fmt::format("{}x{}", ranks, accumulate);
  const std::string flags = fmt::format("{} --checkpoint-every 0 --quiet --accumulate {}", steps, accumulate);
  Run plain = f.train(mpirun(ranks), f.micro, flags, "plain" + name);
  Run zero = f.train(mpirun(ranks), sharded, flags, "zero" + name);  // --zero 3: the trainer's default
  INFO(plain.out << zero.out);
  REQUIRE(plain.status == 0);
  REQUIRE(zero.status == 0);
  check_losses_agree(f.losses("zero" + name), f.losses("plain" + name), kZero3Agreement);
}

}  // namespace

TEST_CASE("ZeRO-3: one process trains bit for bit as without, 2 and 4 ranks as plain data parallel, accumulating or not (issue 40)") {
  Fixture f;
  const std::string sharded = f.build("gpt-b2-zero3", 2, "--zero 3");
  const std::string flags = "--steps 8 --checkpoint-every 0 --quiet";
  Run plain = f.train("", f.micro, flags, "alone_plain");
  Run zero = f.train("", sharded, flags, "alone_zero");
  INFO(plain.out << zero.out);
  REQUIRE(plain.status == 0);
  REQUIRE(zero.status == 0);
  CHECK(f.losses("alone_zero") == f.losses("alone_plain"));
  for (int ranks : {2, 4})
    for (int accumulate : {1, 2}) check_zero3_trains_as_plain(f, sharded, ranks, accumulate, "--steps 20");
  CHECK(f.losses("zero2x1").back().second < f.losses("zero2x1").front().second - 0.1);

  // The banner says what rank 0 holds; a trainer built without --zero 3 refuses it.
  Run shown = f.train(mpirun(2), sharded, "--steps 1 --checkpoint-every 0", "shown");
  INFO(shown.out);
  CHECK(shown.out.find("ZeRO-3     rank 0 holds ") != std::string::npos);
  CHECK(shown.out.find("parameters gathered and gradients reduced by MPI in the step") != std::string::npos);
  CHECK(shown.out.find("the gathers issued ahead run on a thread of their own") != std::string::npos);
  // The prefetch moves when the gathers run, not what they compute: built without it, the same bits.
  const std::string unprefetched = f.build("gpt-b2-zero3-noprefetch", 2, "--zero 3 --no-prefetch");
  Run late = f.train(mpirun(2), unprefetched, "--steps 20 --checkpoint-every 0 --quiet --accumulate 1", "late");
  INFO(late.out);
  REQUIRE(late.status == 0);
  CHECK(f.losses("late") == f.losses("zero2x1"));
  Run refused = f.train(mpirun(2), f.micro, "--steps 1 --checkpoint-every 0 --zero 3", "refused");
  INFO(refused.out);
  CHECK(refused.status == 1);
  CHECK(refused.out.find("napkin build MODEL --zero 3") != std::string::npos);
  // The same trainer runs the other stages, its collectives then copies.
  Run zero1 = f.train(mpirun(2), sharded, "--steps 8 --checkpoint-every 0 --quiet --zero 1", "zero1");
  Run plain1 = f.train(mpirun(2), f.micro, "--steps 8 --checkpoint-every 0 --quiet --zero 1", "plain1");
  REQUIRE(zero1.status == 0);
  REQUIRE(plain1.status == 0);
  CHECK(f.losses("zero1") == f.losses("plain1"));
}

TEST_CASE("ZeRO-3: bf16- and fp16-mixed (the overflow skip on every rank together), and eval shares of unequal length (issue 40)") {
  for (const std::string precision : {"bf16-mixed", "{policy: fp16-mixed, loss_scale: {init: 1048576}}"}) {
    CAPTURE(precision);
    Fixture f("", precision);
    const std::string sharded = f.build("gpt-b2-zero3", 2, "--zero 3");
    check_zero3_trains_as_plain(f, sharded, 2, 1, "--steps 12");
    check_zero3_trains_as_plain(f, sharded, 4, 1, "--steps 12");
  }
  // 3 eval batches on 2 ranks: rank 1 runs a second forward it does not count, so that rank 0's gathers meet
  // theirs; the eval loss is plain data parallel's.
  Fixture f;
  const std::string sharded = f.build("gpt-b2-zero3", 2, "--zero 3");
  const std::string flags = "--steps 4 --checkpoint-every 0 --quiet --eval-every 2 --eval-batches 3";
  Run plain = f.train(mpirun(2), f.micro, flags, "eval_plain");
  Run zero = f.train(mpirun(2), sharded, flags, "eval_zero");
  INFO(plain.out << zero.out);
  REQUIRE(plain.status == 0);
  REQUIRE(zero.status == 0);
  auto evals = [&](const std::string& name) {
    std::vector<double> out;
    std::istringstream lines(napkin::testing::read_bytes(f.tmp / (name + ".jsonl")));
    for (std::string line; std::getline(lines, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("eval_loss")) out.push_back(j.at("eval_loss").get<double>());
    }
    return out;
  };
  REQUIRE(evals("eval_plain").size() == 2);
  CHECK(evals("eval_zero") == evals("eval_plain"));
}

TEST_CASE("ZeRO-3: its checkpoints resume on another rank count, in one process and with the plain trainer, sharded or single (issue 40)") {
  Fixture f;
  const std::string sharded = f.build("gpt-b2-zero3", 2, "--zero 3");
  const std::string dir = f.tmp / "ckpt", single = f.tmp / "single";
  // 2 ranks × 2 accumulated, then 4 ranks × 1 and one process × 4: 4 micro-batches per step throughout.
  Run straight = f.train(mpirun(2), sharded, "--steps 12 --quiet --checkpoint-every 0 --accumulate 2", "straight");
  Run first = f.train(mpirun(2), sharded, fmt::format("--steps 6 --quiet --accumulate 2 --checkpoint-dir {}", dir), "first");
  Run first_single = f.train(mpirun(2), sharded,
                             fmt::format("--steps 6 --quiet --accumulate 2 --checkpoint-format single --checkpoint-dir {}",
                                         single),
                             "first_single");
  INFO(straight.out << first.out << first_single.out);
  REQUIRE(straight.status == 0);
  REQUIRE(first.status == 0);
  REQUIRE(first_single.status == 0);
  CHECK(f.losses("first") == f.losses("first_single"));
  // Each rank wrote its own parameters and their state; rank 0 gathered them all into the single file.
  const std::string consolidated = f.tmp / "consolidated.safetensors";
  Run consolidate = sh(fmt::format("{} checkpoint consolidate {}/step-000006.sharded -o {}", NAPKIN_BINARY, dir, consolidated));
  INFO(consolidate.out);
  REQUIRE(consolidate.status == 0);
  CHECK(checkpoint_data(consolidated) == checkpoint_data(single + "/step-000006.safetensors"));

  Run four = f.train(mpirun(4), sharded, fmt::format("--steps 12 --quiet --resume {}", dir), "four");
  Run alone = f.train("", sharded, fmt::format("--steps 12 --quiet --accumulate 4 --resume {}/step-000006.sharded "
                                               "--checkpoint-dir {}", dir, f.tmp / "alone"), "alone");
  Run from_single = f.train(mpirun(4), sharded, fmt::format("--steps 12 --quiet --resume {}", single), "from_single");
  // A step built for ZeRO-3 is the unsharded step's model (its hash): the plain trainer continues the run.
  Run plain = f.train("", f.micro, fmt::format("--steps 12 --quiet --accumulate 4 --resume {}/step-000006.sharded "
                                               "--checkpoint-dir {}", dir, f.tmp / "plain"), "plain");
  INFO(four.out << alone.out << from_single.out << plain.out);
  REQUIRE(four.status == 0);
  REQUIRE(alone.status == 0);
  REQUIRE(from_single.status == 0);
  REQUIRE(plain.status == 0);
  for (const char* resumed : {"four", "alone", "from_single", "plain"}) {
    CAPTURE(resumed);
    check_losses_agree(f.resumed_losses("first", resumed), f.losses("straight"), kZero3Agreement);
  }
}

TEST_CASE("ZeRO hybrid sharding: 4 ranks in 2 groups of 2 train as plain data parallel under --zero 1, 2 and 3, and resume on 2 ranks (issue 40)") {
  Fixture f;
  const std::string sharded = f.build("gpt-b2-zero3", 2, "--zero 3");
  const std::string flags = "--steps 12 --checkpoint-every 0 --quiet";
  Run plain = f.train(mpirun(4), f.micro, flags, "plain");
  REQUIRE(plain.status == 0);
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    const std::string name = fmt::format("hybrid{}", stage);
    Run r = f.train(mpirun(4), stage == 3 ? sharded : f.micro, fmt::format("{} --zero {} --shard-group 2", flags, stage),
                    name);
    INFO(r.out);
    REQUIRE(r.status == 0);
    check_losses_agree(f.losses(name), f.losses("plain"), kZero3Agreement);
  }
  // Every group holds the whole run: the first writes the checkpoint, which 2 ranks without groups continue.
  const std::string dir = f.tmp / "ckpt";
  Run first = f.train(mpirun(4), sharded, fmt::format("--steps 6 --quiet --shard-group 2 --checkpoint-dir {}", dir), "first");
  INFO(first.out);
  REQUIRE(first.status == 0);
  Run second = f.train(mpirun(2), sharded, fmt::format("--steps 12 --quiet --accumulate 2 --resume {}", dir), "second");
  INFO(second.out);
  REQUIRE(second.status == 0);
  check_losses_agree(f.resumed_losses("first", "second"), f.losses("plain"), kZero3Agreement);
  // Groups that do not divide the ranks are refused before step 1.
  Run refused = f.train(mpirun(4), sharded, "--steps 2 --checkpoint-every 0 --shard-group 3", "refused");
  INFO(refused.out);
  CHECK(refused.status == 1);
  CHECK(refused.out.find("--shard-group 3: the 4 ranks do not split into groups of 3") != std::string::npos);
}

TEST_CASE("ZeRO-2 and 3: a parameter the loss never reads owns no part of the norm, and the others share out as usual (issue 40)") {
  // An unused matrix has no gradient and no update: the clipping norm serves every *updated* parameter, which
  // every rank must sum its part of, and the trained parameters are still units of their own (before, the norm's
  // kernels bound them into one, and the rank holding only the unused matrix skipped them yet met the all-reduce).
  Fixture f;
  std::string yaml = napkin::testing::read_bytes(f.tmp / "gpt.yaml");
  const size_t at = yaml.find("params:\n");
  REQUIRE(at != std::string::npos);
  yaml.insert(at + 8, "  unused: {shape: [d, hidden], init: normal(0.02)}\n");
  napkin::testing::write_bytes(f.tmp / "gpt.yaml", yaml);
  const std::string plain = f.build("gpt-unused", 2, ""), sharded = f.build("gpt-unused-zero3", 2, "--zero 3");
  const std::string flags = "--steps 12 --checkpoint-every 0 --quiet";
  Run base = f.train(mpirun(2), plain, flags, "base");
  Run zero2 = f.train(mpirun(2), plain, flags + " --zero 2", "zero2");
  Run zero3 = f.train(mpirun(2), sharded, flags, "zero3");
  INFO(base.out << zero2.out << zero3.out);
  REQUIRE(base.status == 0);
  REQUIRE(zero2.status == 0);
  REQUIRE(zero3.status == 0);
  check_losses_agree(f.losses("zero2"), f.losses("base"), kZero3Agreement);
  check_losses_agree(f.losses("zero3"), f.losses("base"), kZero3Agreement);
  // Rank 0 holds some of the trained parameters, not all of them.
  Run shown = f.train(mpirun(2), sharded, "--steps 1 --checkpoint-every 0", "shown");
  INFO(shown.out);
  const size_t holds = shown.out.find("ZeRO-3     rank 0 holds ");
  REQUIRE(holds != std::string::npos);
  CHECK(shown.out.find(" of 13 parameters", holds) != std::string::npos);
  CHECK(shown.out.find("rank 0 holds 12 of 13", holds) == std::string::npos);
  CHECK(shown.out.find("rank 0 holds 1 of 13", holds) == std::string::npos);
}
