// Sharded checkpoints (runtime/sharded_checkpoint.h) without MPI: the ranks'
// parts of a save made in one process, as the trainer's ranks make them. The
// whole loads as one checkpoint, consolidates into exactly the file the
// single format writes, and every damage is named; the checkpoint directory's
// rules (temporaries, pruning, ambiguity) hold for directories as for files.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "runtime/checkpoint.h"
#include "runtime/checkpoint_dir.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "runtime/sharded_checkpoint.h"
#include "support/test_io.h"

namespace rt = napkin::runtime;
namespace fs = std::filesystem;

namespace {

using napkin::testing::error_of;
using napkin::testing::read_bytes;
using napkin::testing::write_bytes;

const std::string kRun = "00112233aabbccdd";

// A run's tensors (parameters, their state, a shared counter) with distinct
// bytes, and which of 3 ranks owns each.
struct State {
  std::vector<float> wte, w, m_wte, m_w;
  std::vector<uint16_t> b;  // bf16 bits
  int64_t step = 0;
  explicit State(float base) : wte(6), w(4), m_wte(6), m_w(4), b(3) {
    for (size_t i = 0; i < wte.size(); ++i) wte[i] = base + static_cast<float>(i), m_wte[i] = -base - static_cast<float>(i);
    for (size_t i = 0; i < w.size(); ++i) w[i] = base * 2 + static_cast<float>(i), m_w[i] = base / 3 + static_cast<float>(i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(0x3f80 + i + static_cast<size_t>(base));
    step = static_cast<int64_t>(base) * 7;
  }
  // In a single-file checkpoint's order: parameters, then state.
  std::vector<rt::TensorRef> all() {
    return {{"wte", "f32", {2, 3}, wte.data()},     {"w", "f32", {2, 2}, w.data()},
            {"b", "bf16", {3}, b.data()},           {"adam.m.wte", "f32", {2, 3}, m_wte.data()},
            {"adam.m.w", "f32", {2, 2}, m_w.data()}, {"optimizer.step", "i64", {}, &step}};
  }
  std::vector<rt::TensorRef> params() {
    std::vector<rt::TensorRef> t = all();
    t.resize(3);
    return t;
  }
};
// wte and its state on rank 1, w and its state on rank 2, b and the counter on rank 0.
const std::vector<int> kOwner = {1, 2, 0, 1, 2, 0};
const std::map<std::string, std::string> kMeta = {{"model", "tiny"}, {"seed", "42"}, {"micro_batches_per_step", "3"}};

// What the trainer's save does on 3 ranks, in one process: rank 0's
// temporary, each rank's file, the index and the rename.
std::string save_sharded(rt::CheckpointDir& dir, int64_t step, State& s, int64_t keep, const std::string& hash = "h") {
  const int ranks = 3;
  const std::string temporary = dir.begin_sharded_save(step);
  const std::vector<rt::TensorRef> all = s.all();
  rt::ShardedIndex index{step, ranks, hash, kRun, {}, {}};
  for (int r = 0; r < ranks; ++r) {
    std::vector<rt::TensorRef> mine;
    for (size_t i = 0; i < all.size(); ++i)
      if (kOwner[i] == r) mine.push_back(all[i]);
    index.files.push_back(rt::write_shard(temporary, r, ranks, step, mine, hash, kRun, kMeta));
  }
  for (size_t i = 0; i < all.size(); ++i) index.weight_map.emplace_back(all[i].name, rt::shard_filename(kOwner[i], ranks));
  return dir.finish_sharded_save(temporary, index, keep);
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Flips one byte `from_end` bytes before the end of `path` (in the data section).
void flip_byte(const std::string& path, size_t from_end) {
  std::string bytes = read_bytes(path);
  bytes[bytes.size() - from_end] ^= 0x01;
  write_bytes(path, bytes);
}

}  // namespace

TEST_CASE("sharded checkpoint: names - step-N.sharded, one file per rank, the temporaries of interrupted saves") {
  CHECK(rt::sharded_checkpoint_dirname(100) == "step-000100.sharded");
  CHECK(rt::sharded_checkpoint_step("step-000100.sharded") == 100);
  CHECK(rt::sharded_checkpoint_step("step-1234567.sharded") == 1234567);
  CHECK(!rt::sharded_checkpoint_step("step-000100.safetensors"));
  CHECK(!rt::sharded_checkpoint_step("step-x.sharded"));
  CHECK(rt::shard_filename(1, 4) == "rank-00001-of-00004.safetensors");
  CHECK(rt::is_checkpoint_temporary(".tmp-step-000100.sharded-AbC123"));
  CHECK(!rt::is_checkpoint_temporary(".tmp-step-000100.sharded-AbC12"));
  CHECK(!rt::is_checkpoint_temporary("step-000100.sharded"));
}

TEST_CASE("sharded checkpoint: 3 ranks' files load as one checkpoint and consolidate into the single format's file, byte for byte") {
  napkin::testing::TempDir tmp("sharded-ckpt");
  const std::string dir = tmp / "ckpt";
  State saved(1);
  std::string path;
  {
    rt::CheckpointDir run(dir, {"h", kRun});
    path = save_sharded(run, 5, saved, 0);
  }
  CHECK(path == dir + "/step-000005.sharded");
  CHECK(files_in(dir) == std::vector<std::string>{".lock", "step-000005.sharded"});  // no temporary left
  CHECK(files_in(path) == std::vector<std::string>{"index.json", "rank-00000-of-00003.safetensors",
                                                   "rank-00001-of-00003.safetensors", "rank-00002-of-00003.safetensors"});
  // Each file is an ordinary checkpoint of its rank's tensors.
  rt::SafetensorsFile rank1(path + "/rank-00001-of-00003.safetensors");
  CHECK(rank1.tensors().size() == 2);
  CHECK(rank1.find("wte") != nullptr);
  CHECK(rank1.find("adam.m.wte") != nullptr);
  CHECK(rank1.metadata().at("shard_rank") == "1");
  CHECK(rt::verify_checkpoint(rank1.path(), "h").step == 5);
  // The index in weight_map's order, every file's size and CRC of all its bytes.
  const rt::ShardedIndex index = rt::read_sharded_index(path);
  CHECK(index.step == 5);
  CHECK(index.ranks == 3);
  REQUIRE(index.weight_map.size() == 6);
  CHECK(index.weight_map[0] == std::pair<std::string, std::string>{"wte", "rank-00001-of-00003.safetensors"});
  CHECK(index.weight_map[5] == std::pair<std::string, std::string>{"optimizer.step", "rank-00000-of-00003.safetensors"});
  const std::string bytes1 = read_bytes(rank1.path());
  CHECK(index.files[1].bytes == static_cast<int64_t>(bytes1.size()));
  CHECK(index.files[1].crc == rt::crc32c(bytes1.data(), bytes1.size()));

  // Listed among the directory's checkpoints, and read whole, bit for bit.
  REQUIRE(rt::list_checkpoints(dir).size() == 1);
  CHECK(rt::list_checkpoints(dir).front() == std::pair<int64_t, std::string>{5, path});
  State loaded(9);
  const rt::CheckpointHeader h = rt::read_checkpoint(path, loaded.all(), "h");
  CHECK(h.step == 5);
  CHECK(h.run == kRun);
  CHECK(h.path == path);
  CHECK(h.metadata.at("micro_batches_per_step") == "3");
  CHECK(loaded.wte == saved.wte);
  CHECK(loaded.m_w == saved.m_w);
  CHECK(loaded.b == saved.b);
  CHECK(loaded.step == saved.step);
  CHECK(rt::verify_checkpoint(path, "h").step == 5);
  CHECK(rt::read_checkpoint_header(path).seed == 42u);
  // The weights alone (napkin sample) and --init read it too, the state skipped.
  State weights(9), init(9);
  CHECK(rt::read_model_weights(path, weights.params(), "h").has_value());
  CHECK(weights.w == saved.w);
  CHECK(weights.m_w == State(9).m_w);
  CHECK(rt::read_weights(path, init.params(), {"adam.m.wte", "adam.m.w", "optimizer.step"}).size() == 3);
  CHECK(init.wte == saved.wte);
  // Another model's trainer is refused as with a file.
  CHECK(error_of([&] { rt::read_checkpoint(path, loaded.all(), "other"); }).find("written by a different model") !=
        std::string::npos);

  // consolidate: exactly the file the single format writes of the same state and run.
  const rt::CheckpointHeader c = rt::consolidate_sharded_checkpoint(path, tmp / "one.safetensors");
  CHECK(c.step == 5);
  rt::write_checkpoint(tmp / "single", 5, saved.all(), "h", kRun, kMeta);
  CHECK(read_bytes(tmp / "one.safetensors") == read_bytes(tmp / "single/step-000005.safetensors"));
}

TEST_CASE("sharded checkpoint: a flipped byte, a missing file, a damaged index or a lone shard are refused, naming it") {
  napkin::testing::TempDir tmp("sharded-bad");
  const std::string dir = tmp / "ckpt";
  State saved(1), loaded(9);
  std::string path;
  {
    rt::CheckpointDir run(dir, {"h", kRun});
    path = save_sharded(run, 5, saved, 0);
  }
  const std::string shard = path + "/rank-00002-of-00003.safetensors";
  const std::string good = read_bytes(shard);
  flip_byte(shard, 3);
  std::string e = error_of([&] { rt::read_checkpoint(path, loaded.all(), "h"); });
  CHECK(e.starts_with(shard + ": checksum mismatch (the file is corrupt): index.json says crc32c:"));
  CHECK(error_of([&] { rt::verify_checkpoint(path, "h"); }) == e);
  CHECK(loaded.step == State(9).step);  // nothing loaded
  write_bytes(shard, good);
  fs::remove(shard);
  e = error_of([&] { rt::read_checkpoint(path, loaded.all(), "h"); });
  CHECK(e == shard + ": missing: the sharded checkpoint " + path + " lacks rank 2's file (3 ranks wrote it); it cannot "
                     "be loaded");
  CHECK(error_of([&] { rt::consolidate_sharded_checkpoint(path, tmp / "one.safetensors"); }) == e);
  CHECK(!fs::exists(tmp / "one.safetensors"));
  write_bytes(shard, good);
  // A file of another size than the index says (a shard of another save copied in).
  write_bytes(shard, good + "12345678");
  CHECK(error_of([&] { rt::verify_checkpoint(path, "h"); })
            .starts_with(shard + ": " + std::to_string(good.size() + 8) + " bytes, index.json says " +
                         std::to_string(good.size())));
  write_bytes(shard, good);
  CHECK(rt::verify_checkpoint(path, "h").step == 5);
  // index.json damaged.
  const std::string index = read_bytes(path + "/index.json");
  write_bytes(path + "/index.json", index.substr(0, index.size() / 2));
  CHECK(error_of([&] { rt::read_checkpoint(path, loaded.all(), "h"); })
            .starts_with(path + "/index.json: not valid JSON: "));
  // ... or gone: the directory is still a sharded checkpoint by its name, and the error names the index.
  fs::remove(path + "/index.json");
  CHECK(rt::is_sharded_checkpoint(path));
  CHECK(error_of([&] { rt::read_checkpoint(path, loaded.all(), "h"); })
            .starts_with(path + "/index.json: cannot open: No such file or directory"));
  write_bytes(path + "/index.json", index);
  // One rank's file read as a checkpoint is a part of one: said so.
  CHECK(error_of([&] { rt::read_checkpoint(shard, loaded.all(), "h"); })
            .starts_with(shard + ": is one rank's file of a sharded checkpoint, a part of the run's state: read its "
                                 "directory (" + path + ")"));
}

TEST_CASE("checkpoint dir: sharded checkpoints - temporaries removed at start-up, pruned by --keep, a step saved both ways refused") {
  napkin::testing::TempDir tmp("sharded-dir");
  const std::string dir = tmp / "ckpt";
  fs::create_directories(dir + "/.tmp-step-000007.sharded-AbC123");
  write_bytes(dir + "/.tmp-step-000007.sharded-AbC123/rank-00000-of-00002.safetensors", "half a shard");
  State s(1);
  {
    rt::CheckpointDir run(dir, {"h", kRun});
    CHECK(run.temporaries_removed() == 1);
    for (int64_t step : {1, 2, 3}) save_sharded(run, step, s, 2);
    run.save(4, s.all(), kMeta, 2);  // a single file beside them: the same lineage
    CHECK(files_in(dir) == std::vector<std::string>{".lock", "step-000003.sharded", "step-000004.safetensors"});
    // A step is saved one way only.
    CHECK(error_of([&] { save_sharded(run, 4, s, 2); })
              .starts_with(dir + "/step-000004.safetensors: step 4 is saved there already; saving it as " + dir +
                           "/step-000004.sharded too would make it ambiguous"));
    CHECK(files_in(dir) == std::vector<std::string>{".lock", "step-000003.sharded", "step-000004.safetensors"});
  }
  // Another run's directory is foreign as its files are.
  CHECK(error_of([&] { rt::CheckpointDir other(dir, {"h", "ffffffffffffffff"}); })
            .starts_with(dir + ": holds 2 checkpoints that this run did not write (step-000003.sharded, "
                               "step-000004.safetensors; "));
  // Resumed from step 3 while 4 is there: the abandoned branch, refused.
  CHECK(error_of([&] { rt::CheckpointDir branch(dir, {"h", kRun, 3}); })
            .starts_with(dir + ": holds 1 checkpoint of this run newer than step 3, the one resumed from "
                               "(step-000004.safetensors)"));
  // Step 3 saved both ways (a copy made by hand): ambiguous, for the trainer's start-up and for --resume DIR.
  rt::write_checkpoint(dir, 3, s.all(), "h", kRun, kMeta);
  CHECK(error_of([&] { rt::CheckpointDir run(dir, {"h", kRun}); }) ==
        dir + ": step 3 is saved both as step-000003.safetensors and as step-000003.sharded: which is the run's is "
              "ambiguous; move one of them away");
  CHECK(error_of([&] { rt::list_checkpoints(dir); }).starts_with(dir + ": step 3 is saved both as "));
  fs::remove(dir + "/step-000003.safetensors");
  // A file named like a sharded checkpoint is in the way of that step's save.
  write_bytes(dir + "/step-000009.sharded", "");
  CHECK(error_of([&] { rt::CheckpointDir run(dir, {"h", kRun}); })
            .starts_with(dir + ": holds 1 entry named like a checkpoint that is not a regular file (or, named "
                               "step-N.sharded, not a directory)"));
}
