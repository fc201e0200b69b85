// Sharded checkpoints of data-parallel jobs (docs/distributed.md, "Checkpoints
// of sharded runs"): CPU trainers under mpirun with --zero 1 write one file per
// rank and an index, which resume on another rank count or in one process as
// the same run, consolidate into the single format's file, are refused when a
// shard is damaged or missing, and survive a rank killed in the middle of a
// save. ZeRO-1 trains bit for bit as plain data parallel, so a resume with the
// same split must give the same losses exactly; another split agrees to f32
// rounding (tests/support/data_parallel_jobs.h).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/checkpoint.h"
#include "runtime/safetensors.h"
#include "runtime/sharded_checkpoint.h"
#include "support/checkpoint_content.h"
#include "support/data_parallel_jobs.h"
#include "support/test_io.h"

namespace fs = std::filesystem;

namespace {

using namespace napkin::testing::data_parallel;
using napkin::testing::read_bytes;
using napkin::testing::write_bytes;

using Losses = std::vector<std::pair<int64_t, double>>;

// The steps of `losses` after `step`.
Losses after(const Losses& losses, int64_t step) {
  Losses out;
  for (const auto& l : losses)
    if (l.first > step) out.push_back(l);
  return out;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("sharded checkpoint: a ZeRO-1 job on 2 ranks writes one file per rank, resumed on 2 and 4 ranks and in one process as the same run, and consolidates into the single format's file") {
  Fixture f;
  const std::string dir = f.tmp / "ckpt";
  // 2 ranks × 2 accumulated: 4 micro-batches a step. The run saved at steps 4 and 8 is the uninterrupted one.
  Run run = f.train(mpirun(2), f.micro, fmt::format("--steps 8 --quiet --zero 1 --accumulate 2 --checkpoint-every 4 "
                                                    "--keep 0 --checkpoint-dir {}", dir),
                    "straight");
  INFO(run.out);
  REQUIRE(run.status == 0);
  CHECK(entries(dir) == std::vector<std::string>{".lock", "step-000004.sharded", "step-000008.sharded"});
  const std::string step4 = dir + "/step-000004.sharded";
  CHECK(entries(step4) == std::vector<std::string>{"index.json", "rank-00000-of-00002.safetensors",
                                                    "rank-00001-of-00002.safetensors"});
  // Each rank wrote what it owns: rank 1 holds parameters and their state, rank 0 the step counter too.
  const napkin::runtime::ShardedIndex index = napkin::runtime::read_sharded_index(step4);
  int on_rank1 = 0;
  for (const auto& [tensor, file] : index.weight_map) on_rank1 += file == "rank-00001-of-00002.safetensors";
  CHECK(on_rank1 > 0);
  CHECK(on_rank1 < static_cast<int>(index.weight_map.size()));
  napkin::runtime::SafetensorsFile rank1(step4 + "/rank-00001-of-00002.safetensors");
  CHECK(rank1.find("optimizer.step") == nullptr);
  CHECK(static_cast<int>(rank1.tensors().size()) == on_rank1);
  const Losses straight = f.losses("straight");
  REQUIRE(straight.size() == 8);

  // The same split, from the directory named with a trailing slash: exactly the uninterrupted losses.
  Run same = f.train(mpirun(2), f.micro, fmt::format("--steps 8 --quiet --zero 1 --accumulate 2 --resume {}/ "
                                                     "--checkpoint-dir {}", step4, f.tmp / "same"),
                     "same");
  INFO(same.out);
  REQUIRE(same.status == 0);
  CHECK(f.losses("same") == after(straight, 4));
  // 4 ranks × 1 and one process × 4: the same global batch split otherwise.
  Run four = f.train(mpirun(4), f.micro, fmt::format("--steps 8 --quiet --zero 1 --accumulate 1 --resume {} "
                                                     "--checkpoint-dir {}", step4, f.tmp / "four"),
                     "four");
  Run one = f.train("", f.micro, fmt::format("--steps 8 --quiet --accumulate 4 --resume {} --checkpoint-dir {}", step4,
                                             f.tmp / "one"),
                    "one");
  INFO(four.out << one.out);
  REQUIRE(four.status == 0);
  REQUIRE(one.status == 0);
  check_losses_agree(f.losses("four"), after(straight, 4), kF32Agreement);
  check_losses_agree(f.losses("one"), after(straight, 4), kF32Agreement);
  CHECK(fs::exists(f.tmp / "four/step-000008.sharded"));    // 4 ranks under ZeRO-1: sharded
  CHECK(fs::exists(f.tmp / "one/step-000008.safetensors"));  // one process: one file

  // consolidate: the single format's file of the same state, as plain data parallel writes it (ZeRO-1 is bit
  // for bit plain): every tensor and every metadata value but the run id and the checksum that covers it.
  Run plain = f.train(mpirun(2), f.micro, fmt::format("--steps 4 --quiet --accumulate 2 --checkpoint-dir {}", f.tmp / "plain"),
                      "plain");
  INFO(plain.out);
  REQUIRE(plain.status == 0);
  const std::string consolidated = f.tmp / "consolidated.safetensors";
  Run c = sh(fmt::format("{} checkpoint consolidate {} -o {}", NAPKIN_BINARY, step4, consolidated));
  INFO(c.out);
  REQUIRE(c.status == 0);
  CHECK(c.out.find("wrote " + consolidated + ": step 4 of run ") != std::string::npos);
  CHECK(napkin::testing::checkpoint_content(consolidated) ==
        napkin::testing::checkpoint_content(f.tmp / "plain/step-000004.safetensors"));
  CHECK(napkin::runtime::read_checkpoint_header(consolidated).run == index.run);
  // A plain job asked for sharded checkpoints shares the writing out the same way: the same state again.
  Run plain_sharded = f.train(mpirun(2), f.micro, fmt::format("--steps 4 --quiet --accumulate 2 --checkpoint-format sharded "
                                                              "--checkpoint-dir {}", f.tmp / "plain-sharded"),
                              "plain-sharded");
  INFO(plain_sharded.out);
  REQUIRE(plain_sharded.status == 0);
  CHECK(napkin::runtime::consolidate_sharded_checkpoint(f.tmp / "plain-sharded/step-000004.sharded",
                                                        f.tmp / "plain-sharded.safetensors").step == 4);
  CHECK(napkin::testing::checkpoint_content(f.tmp / "plain-sharded.safetensors") ==
        napkin::testing::checkpoint_content(f.tmp / "plain/step-000004.safetensors"));
  // Not beside the directory as its step's file (the step would be saved twice), nor from a file.
  Run twice = sh(fmt::format("{} checkpoint consolidate {} -o {}/step-000004.safetensors", NAPKIN_BINARY, step4, dir));
  CHECK(twice.status == 1);
  CHECK(twice.out.find("it would save step 4 twice, which --resume refuses as ambiguous") != std::string::npos);
  CHECK(!fs::exists(dir + "/step-000004.safetensors"));
  Run not_sharded = sh(fmt::format("{} checkpoint consolidate {} -o {}", NAPKIN_BINARY, consolidated, f.tmp / "x.safetensors"));
  CHECK(not_sharded.status == 1);
  CHECK(not_sharded.out.find("not a sharded checkpoint") != std::string::npos);
  // ... which resumes as the sharded checkpoint does: the same bits.
  Run from_file = f.train("", f.micro, fmt::format("--steps 8 --quiet --accumulate 4 --resume {} --checkpoint-dir {}",
                                                   consolidated, f.tmp / "from-file"),
                          "from-file");
  INFO(from_file.out);
  REQUIRE(from_file.status == 0);
  CHECK(f.losses("from-file") == f.losses("one"));
  // verify names what it checked.
  Run v = sh(fmt::format("{} checkpoint verify {}", NAPKIN_BINARY, step4));
  INFO(v.out);
  CHECK(v.status == 0);
  CHECK(v.out.find(step4 + ": a whole checkpoint: step 4 of run " + index.run) != std::string::npos);
  CHECK(v.out.find("2 shards, every file's size and checksum verified") != std::string::npos);
  Run part = sh(fmt::format("{} checkpoint verify {}/rank-00001-of-00002.safetensors", NAPKIN_BINARY, step4));
  CHECK(part.status == 0);
  CHECK(part.out.find("intact, but one rank's file (rank 1 of 2) of a sharded checkpoint of step 4") != std::string::npos);
}

TEST_CASE("sharded checkpoint: a corrupt or missing shard is refused, naming it, and nothing trains") {
  Fixture f;
  const std::string dir = f.tmp / "ckpt";
  Run run = f.train(mpirun(2), f.micro, fmt::format("--steps 2 --quiet --zero 1 --checkpoint-dir {}", dir), "first");
  INFO(run.out);
  REQUIRE(run.status == 0);
  const std::string shard = dir + "/step-000002.sharded/rank-00001-of-00002.safetensors";
  const std::string good = read_bytes(shard);
  std::string bad = good;
  bad[bad.size() - 5] ^= 0x10;  // a flipped bit in the last tensor's bytes
  write_bytes(shard, bad);
  const std::string resume = fmt::format("--steps 4 --quiet --accumulate 2 --resume {}", dir);
  Run corrupt = f.train("", f.micro, resume, "corrupt");
  INFO(corrupt.out);
  CHECK(corrupt.status == 1);
  CHECK(corrupt.out.find("error: " + shard + ": checksum mismatch (the file is corrupt)") != std::string::npos);
  CHECK(!fs::exists(f.tmp / "corrupt.jsonl"));  // nothing trained
  Run verify = sh(fmt::format("{} checkpoint verify {}", NAPKIN_BINARY, dir + "/step-000002.sharded"));
  CHECK(verify.status == 1);
  CHECK(verify.out.find(shard + ": checksum mismatch") != std::string::npos);
  fs::remove(shard);
  Run missing = f.train("", f.micro, resume, "missing");
  INFO(missing.out);
  CHECK(missing.status == 1);
  CHECK(missing.out.find("error: " + shard + ": missing: the sharded checkpoint " + dir +
                         "/step-000002.sharded lacks rank 1's file") != std::string::npos);
  CHECK(!fs::exists(f.tmp / "missing.jsonl"));
  write_bytes(shard, good);
  Run restored = f.train("", f.micro, resume, "restored");
  INFO(restored.out);
  CHECK(restored.status == 0);
  // --init takes its weights, on every rank of a job (which agree on it by its index).
  Run init = f.train(mpirun(2), f.micro, fmt::format("--steps 1 --checkpoint-every 0 --init {}/step-000002.sharded", dir),
                     "init");
  INFO(init.out);
  CHECK(init.status == 0);
  CHECK(init.out.find("loaded the weights; ignored the optimizer state it holds") != std::string::npos);
}

TEST_CASE("sharded checkpoint: kill -9 of rank 1 while it writes its shard leaves every earlier checkpoint whole, and the next start removes the temporary") {
  Fixture f;
  const std::string dir = f.tmp / "ckpt", log = f.tmp / "log";
  Run first = f.train(mpirun(2), f.micro, fmt::format("--steps 4 --quiet --zero 1 --checkpoint-every 2 --checkpoint-dir {}", dir),
                      "first");
  INFO(first.out);
  REQUIRE(first.status == 0);
  // Rank 1 (mpirun's second command line) pauses in its shard write of step 6 (runtime/sharded_checkpoint.cpp's
  // test hook) while rank 0 has written its file and waits; then rank 1 is killed.
  const std::string flags = fmt::format("{} --steps 6 --quiet --zero 1 --checkpoint-every 2 --resume {} --metrics {}", kData,
                                        dir, f.tmp / "killed.jsonl");
  const std::string script = fmt::format(
      "{} -np 1 {} {} : -np 1 env NAPKIN_TEST_PAUSE_IN_SHARD_WRITE=60 {} {} > {} 2>&1 &\n"
      "launcher=$!\n"
      "for i in $(seq 600); do ls {}/.tmp-step-000006.sharded-*/rank-00000-of-00002.safetensors >/dev/null 2>&1 && "
      "break; sleep 0.1; done\n"
      "victim=''\n"
      "for p in $(pgrep -P $launcher); do grep -qz '^OMPI_COMM_WORLD_RANK=1$' /proc/$p/environ && victim=$p; done\n"
      "[ -n \"$victim\" ] || {{ echo 'no rank 1 under mpirun'; kill $launcher; exit 3; }}\n"
      "kill -9 $victim; wait $launcher; echo \"status $?\"\n",
      mpirun_launcher(), f.micro, flags, f.micro, flags, log, dir);
  Run killed = sh(script);
  INFO(killed.out << read_bytes(log));
  REQUIRE(killed.status == 0);
  int status = -1;
  REQUIRE(std::sscanf(killed.out.c_str(), "status %d", &status) == 1);
  CHECK(status != 0);
  // Steps 2 and 4 whole (--keep 2), step 6 only a temporary holding rank 0's file.
  std::vector<std::string> left = entries(dir);
  REQUIRE(left.size() == 4);
  CHECK(left[0] == ".lock");
  CHECK(left[1].starts_with(".tmp-step-000006.sharded-"));
  CHECK(left[2] == "step-000002.sharded");
  CHECK(left[3] == "step-000004.sharded");
  CHECK(entries(dir + "/" + left[1]) == std::vector<std::string>{"rank-00000-of-00002.safetensors"});
  for (const char* step : {"step-000002.sharded", "step-000004.sharded"}) {
    CAPTURE(step);
    const std::string path = dir + "/" + step;
    CHECK_NOTHROW(napkin::runtime::verify_checkpoint(path, napkin::runtime::read_checkpoint_header(path).model_hash));
  }
  CHECK(napkin::runtime::list_checkpoints(dir).front().second == dir + "/step-000004.sharded");
  // The next start removes the temporary and goes on from step 4.
  Run resumed = f.train(mpirun(2), f.micro, fmt::format("--steps 6 --zero 1 --checkpoint-every 2 --resume {}", dir),
                        "resumed");
  INFO(resumed.out);
  REQUIRE(resumed.status == 0);
  CHECK(resumed.out.find("removed 1 temporary file that interrupted saves left in " + dir) != std::string::npos);
  CHECK(resumed.out.find("resumed from " + dir + "/step-000004.sharded at step 4") != std::string::npos);
  CHECK(entries(dir) == std::vector<std::string>{".lock", "step-000004.sharded", "step-000006.sharded"});
}
