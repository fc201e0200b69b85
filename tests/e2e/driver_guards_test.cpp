// The driver never destroys what it reads and never hangs on what it is given:
// an output that is also an input or a directory is refused, text and data
// must be regular files (not /dev/zero, not a FIFO without a writer), and a
// damaged cached trainer is rebuilt instead of run.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "support/test_io.h"
#include "support/test_models.h"

namespace fs = std::filesystem;

namespace {

using napkin::testing::read_bytes;
using napkin::testing::write_bytes;
using Run = napkin::testing::CommandResult;
Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

// The trainer cache's checksum of a trainer's bytes (FNV-1a 64, tools/files.h).
std::string fnv1a_hex(const std::string& bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

// The path after "cached at " in napkin train's output, or "".
std::string cached_path(const std::string& out) {
  const size_t at = out.find("(cached at ");
  return at == std::string::npos ? "" : out.substr(at + 11, out.find(')', at) - at - 11);
}

}  // namespace

TEST_CASE("driver: an output that is an input or a directory is refused and nothing is written") {
  napkin::testing::TempDir tmp("driver-outputs");
  const std::string model = tmp / "m.yaml", text = tmp / "in.txt";
  fs::copy_file(std::string(NAPKIN_SOURCE_DIR) + "/models/linear.yaml", model);
  const std::string yaml = read_bytes(model);
  write_bytes(text, "hello");

  Run r = sh(fmt::format("{} build {} -o {}", NAPKIN_BINARY, model, model));
  CHECK(r.status == 1);
  CHECK(r.out.find("-o " + model + ": is also an input") != std::string::npos);
  CHECK(read_bytes(model) == yaml);

  fs::create_directories(tmp / "outdir");
  r = sh(fmt::format("{} build {} -o {}", NAPKIN_BINARY, model, tmp / "outdir"));
  CHECK(r.status == 1);
  CHECK(r.out.find("is a directory") != std::string::npos);
  CHECK(fs::is_empty(tmp / "outdir"));

  r = sh(fmt::format("{} data encode {} -o {}", NAPKIN_BINARY, text, text));
  CHECK(r.status == 1);
  CHECK(r.out.find("is also an input") != std::string::npos);
  CHECK(read_bytes(text) == "hello");

  r = sh(fmt::format("{} data encode {} -o {}", NAPKIN_BINARY, text, tmp / "outdir"));
  CHECK(r.status == 1);
  CHECK(r.out.find("is a directory") != std::string::npos);
  CHECK(fs::is_empty(tmp / "outdir"));
  for (const auto& e : fs::directory_iterator(tmp.path)) CHECK(e.path().extension() != ".tmp");
}

TEST_CASE("driver: every -o refuses its inputs by file, not name - graph --dot, a link, a hard link, the device file") {
  napkin::testing::TempDir tmp("driver-same-file");
  const std::string model = tmp / "m.yaml", devices = tmp / "devices.json", metrics = tmp / "m.jsonl";
  fs::copy_file(std::string(NAPKIN_SOURCE_DIR) + "/models/linear.yaml", model);
  const std::string yaml = read_bytes(model);
  const std::string device_file = "{\"format\": \"napkin-devices-1\", \"devices\": []}\n";
  write_bytes(devices, device_file);
  write_bytes(metrics, "{\"step\": 1, \"loss\": 2}\n");
  fs::create_symlink(model, tmp / "link.yaml");
  fs::create_hard_link(model, tmp / "hard.yaml");
  fs::create_symlink(metrics, tmp / "link.svg");
  const std::string env = "NAPKIN_DEVICES=" + devices + " ";

  for (const std::string& output : {model, std::string("./m.yaml"), tmp / "link.yaml", tmp / "hard.yaml"}) {
    CAPTURE(output);
    Run r = sh(fmt::format("cd {} && {}{} graph {} --dot -o {}", tmp.path, env, NAPKIN_BINARY, model, output));
    CHECK(r.status == 1);
    CHECK(r.out.find("-o " + output + ": is also an input") != std::string::npos);
    r = sh(fmt::format("cd {} && {}{} report {} --html {}", tmp.path, env, NAPKIN_BINARY, model, output));
    CHECK(r.status == 1);
    CHECK(r.out.find("--html " + output + ": is also an input") != std::string::npos);
  }
  CHECK(read_bytes(model) == yaml);

  Run r = sh(fmt::format("{}{} plot {} -o {}", env, NAPKIN_BINARY, metrics, tmp / "link.svg"));
  CHECK(r.status == 1);
  CHECK(r.out.find("is also an input") != std::string::npos);
  CHECK(read_bytes(metrics) == "{\"step\": 1, \"loss\": 2}\n");

  // The local device file is an input of every command.
  r = sh(fmt::format("{}{} graph {} --dot -o {}", env, NAPKIN_BINARY, model, devices));
  CHECK(r.status == 1);
  CHECK(r.out.find("is the local device file") != std::string::npos);
  r = sh(fmt::format("{}{} build {} -o {}", env, NAPKIN_BINARY, model, devices));
  CHECK(r.status == 1);
  CHECK(read_bytes(devices) == device_file);

  r = sh(fmt::format("{}{} graph {} --dot -o {}", env, NAPKIN_BINARY, model, tmp / "m.dot"));
  CHECK(r.status == 0);
  CHECK(read_bytes(tmp / "m.dot").find("digraph") != std::string::npos);
}

TEST_CASE("driver: build -o X writes only X - X.o, a file or a link to one, is left alone and no build files stay") {
  napkin::testing::TempDir tmp("driver-build-private");
  const std::string precious = tmp / "precious.txt", trainer = tmp / "trainer", other = tmp / "other";
  write_bytes(precious, "keep me");
  fs::create_symlink(precious, trainer + ".o");
  write_bytes(other + ".o", "mine too");
  for (const std::string& output : {trainer, other}) {
    CAPTURE(output);
    Run r = sh(fmt::format("{} build models/linear.yaml -o {} --quiet", NAPKIN_BINARY, output));
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK(sh(output + " --print-program").status == 0);
  }
  CHECK(read_bytes(precious) == "keep me");
  CHECK(fs::is_symlink(trainer + ".o"));
  CHECK(read_bytes(other + ".o") == "mine too");
  for (const auto& e : fs::directory_iterator(tmp.path)) {
    CAPTURE(e.path().string());
    CHECK(e.path().filename().string().rfind(".napkin-build-", 0) == std::string::npos);
  }
}

TEST_CASE("driver: data encode reads regular files only - a directory - /dev/zero - a FIFO") {
  napkin::testing::TempDir tmp("driver-inputs");
  Run r = sh(fmt::format("{} data encode {} -o {}", NAPKIN_BINARY, tmp.path, tmp / "out.u16"));
  CHECK(r.status == 1);
  CHECK(r.out.find(tmp.path + ": is a directory") != std::string::npos);
  r = sh(fmt::format("timeout 20 {} data encode /dev/zero -o {}", NAPKIN_BINARY, tmp / "out.u16"));
  CHECK(r.status == 1);
  CHECK(r.out.find("/dev/zero: is not a regular file") != std::string::npos);
  REQUIRE(::mkfifo((tmp / "fifo").c_str(), 0600) == 0);
  r = sh(fmt::format("timeout 20 {} data encode {} -o {}", NAPKIN_BINARY, tmp / "fifo", tmp / "out.u16"));
  CHECK(r.status == 1);  // not 124: it did not block
  CHECK(!fs::exists(tmp / "out.u16"));
}

TEST_CASE("driver: a trainer given a FIFO as data stops at once instead of blocking") {
  napkin::testing::TempDir tmp("driver-fifo");
  const std::string trainer = tmp / "trainer";
  REQUIRE(sh(fmt::format("{} build models/gpt.yaml --dims batch=2,seq=8,d=16,heads=2,layers=1 -o {} --quiet",
                         NAPKIN_BINARY, trainer)).status == 0);
  REQUIRE(::mkfifo((tmp / "fifo").c_str(), 0600) == 0);
  Run r = sh(fmt::format("timeout 20 {} --data {} --steps 1 --quiet", trainer, tmp / "fifo"));
  CHECK(r.status == 1);
  CHECK(r.out.find(tmp / "fifo" + ": not a regular file (it is a FIFO (named pipe))") != std::string::npos);
}

TEST_CASE("driver: napkin train rebuilds a damaged cached trainer instead of running it") {
  napkin::testing::TempDir tmp("driver-cache");
  const std::string train = fmt::format(
      "XDG_CACHE_HOME={} {} train models/gpt.yaml --dims batch=2,seq=8,d=16,heads=2,layers=1 -- "
      "--data tests/e2e/data/gpt/tokens.u16 --steps 1 --quiet --checkpoint-dir {}",
      tmp.path, NAPKIN_BINARY, tmp / "ckpt");
  Run first = sh(train + "/a");
  INFO(first.out);
  REQUIRE(first.status == 0);
  std::string cached;
  for (const auto& e : fs::recursive_directory_iterator(tmp / "napkin"))
    if (e.path().filename() == "trainer") cached = e.path().string();
  REQUIRE(!cached.empty());
  fs::resize_file(cached, fs::file_size(cached) / 2);
  Run second = sh(train + "/b");
  INFO(second.out);
  CHECK(second.status == 0);
  CHECK(second.out.find("is damaged; rebuilding it") != std::string::npos);
  Run third = sh(train + "/c");
  CHECK(third.status == 0);
  CHECK(third.out.find("using the cached trainer") != std::string::npos);
}

TEST_CASE("driver: the trainer cache runs only the user's own - 0700 in TMPDIR without HOME, planted trainers not run") {
  napkin::testing::TempDir tmp("driver-cache-trust");
  const std::string train = fmt::format("env -u HOME -u XDG_CACHE_HOME TMPDIR={} {} train models/linear.yaml -- "
                                        "--print-program", tmp.path, NAPKIN_BINARY);
  Run first = sh(train);
  INFO(first.out);
  REQUIRE(first.status == 0);
  const std::string trainer = cached_path(first.out);
  REQUIRE(!trainer.empty());
  const fs::path root = fs::path(trainer).parent_path().parent_path();
  CHECK(root == fs::path(tmp.path) / fmt::format("napkin-cache-{}", ::geteuid()));  // one per user
  struct stat st {};
  REQUIRE(::stat(root.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  REQUIRE(::stat(fs::path(trainer).parent_path().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);

  // A program planted with the right checksum but writable by others is rebuilt, not run.
  const std::string planted = "#!/bin/sh\necho PLANTED\n";
  auto plant = [&](mode_t mode) {
    write_bytes(trainer, planted);
    write_bytes(trainer + ".sum", fnv1a_hex(planted));
    REQUIRE(::chmod(trainer.c_str(), mode) == 0);
  };
  plant(0777);
  Run second = sh(train);
  INFO(second.out);
  CHECK(second.status == 0);
  CHECK(second.out.find("PLANTED") == std::string::npos);
  CHECK(second.out.find("can be written by other users (mode 777); rebuilding it") != std::string::npos);

  // A cache directory others can write is not trusted at all: an error naming it, nothing run.
  plant(0755);
  REQUIRE(::chmod(root.c_str(), 0777) == 0);
  Run third = sh(train);
  INFO(third.out);
  CHECK(third.status == 1);
  CHECK(third.out.find("PLANTED") == std::string::npos);
  CHECK(third.out.find("error: the trainer cache " + root.string() + ": can be written by other users") !=
        std::string::npos);
  REQUIRE(::chmod(root.c_str(), 0700) == 0);

  // A cache that cannot be written is the user's to fix, not an internal error.
  write_bytes(tmp / "file", "");
  Run fourth = sh(fmt::format("XDG_CACHE_HOME={} {} train models/linear.yaml -- --print-program", tmp / "file",
                              NAPKIN_BINARY));
  INFO(fourth.out);
  CHECK(fourth.status == 1);
  CHECK(fourth.out.find("error: the trainer cache " + tmp / "file/napkin: cannot create it") != std::string::npos);
}

TEST_CASE("driver: the trainer cache keys on the training settings - editing train.steps builds anew") {
  // The graph's text does not show train.steps (the default --steps and the
  // schedule's length): the cache once ran the trainer of the old value.
  napkin::testing::TempDir tmp("driver-cache-settings");
  std::string yaml = napkin::testing::read_source("models/linear.yaml");
  const std::string steps = "steps: 200";
  REQUIRE(yaml.find(steps) != std::string::npos);
  auto train = [&](int n) {
    std::string edited = yaml;
    edited.replace(edited.find(steps), steps.size(), fmt::format("steps: {}", n));
    std::ofstream(tmp / "m.yaml") << edited;
    return sh(fmt::format("XDG_CACHE_HOME={} {} train {} -- --print-program", tmp.path, NAPKIN_BINARY, tmp / "m.yaml"));
  };
  Run first = train(7);
  INFO(first.out);
  REQUIRE(first.status == 0);
  CHECK(first.out.find("\"steps\": 7") != std::string::npos);
  Run second = train(9);
  INFO(second.out);
  REQUIRE(second.status == 0);
  CHECK(second.out.find("using the cached trainer") == std::string::npos);
  CHECK(second.out.find("\"steps\": 9") != std::string::npos);
  Run third = train(9);
  CHECK(third.out.find("using the cached trainer") != std::string::npos);
}
