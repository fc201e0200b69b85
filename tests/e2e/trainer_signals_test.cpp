// Ctrl-C and SIGTERM (docs/runtime.md, "Checkpoints"): the trainer finishes
// the step, saves and exits 130, whatever the moment. The signals are blocked
// in every thread and taken by one (runtime/stop_signals.h), never by a
// handler that could run on a thread inside oneDNN's JIT code; the bounded
// stress test here sends them at random moments (bench/signal_stress.py is
// its 300-trial form).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/checkpoint.h"
#include "runtime/stop_signals.h"
#include "support/test_io.h"

namespace fs = std::filesystem;
using Run = napkin::testing::CommandResult;

namespace {

Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

// A trainer started in the background, its stdout and stderr in `log`.
struct Background {
  pid_t pid = -1;
  std::string log;

  Background(const std::string& command, std::string log_path) : log(std::move(log_path)) {
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      if (::chdir(NAPKIN_SOURCE_DIR) != 0) ::_exit(127);
      ::execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Background() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  std::string output() const { return napkin::testing::read_bytes(log); }

  // Waits until the output holds `text`; false after `seconds` or when the
  // process ended first.
  bool wait_for(const std::string& text, double seconds) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      if (output().find(text) != std::string::npos) return true;
      if (::kill(pid, 0) != 0) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }

  // The raw wait status, or -1 when it has not ended within `seconds` (then
  // it is killed).
  int wait_status(double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return -1;
  }
};

// "exit 130", "killed by signal 11 (core dumped)", ...
std::string describe(int status) {
  if (status == -1) return "still running after the timeout";
  if (WIFEXITED(status)) return fmt::format("exit {}", WEXITSTATUS(status));
  return fmt::format("killed by signal {}{}", WTERMSIG(status), WCOREDUMP(status) ? " (core dumped)" : "");
}

// gpt.yaml with one layer, and its model hash: its GEMMs are big enough for
// oneDNN's JIT kernels, where a handler crashed the trainer (4 of 30 runs
// of the old trainer on 2 threads crashed, "corrupted size vs. prev_size";
// the full gpt.yaml, 11 of 30), and a step takes a fraction of a second.
struct Fixture {
  napkin::testing::TempDir tmp{"e2e-signals"};
  std::string trainer = tmp / "trainer";
  std::string hash;
  Fixture() {
    Run r = sh(fmt::format("{} build models/gpt.yaml --dims layers=1 -o {} --quiet", NAPKIN_BINARY, trainer));
    INFO(r.out);
    REQUIRE(r.status == 0);
    Run program = sh(trainer + " --print-program");
    REQUIRE(program.status == 0);
    hash = nlohmann::json::parse(program.out)["hash"].get<std::string>();
  }
  // A run on 2 threads (as the crashes were seen) long enough never to end
  // by itself, logging every step, evaluating every 2nd and saving every 3rd,
  // so a signal can land in any of them.
  std::string command(const std::string& dir) const {
    return fmt::format("{} --data tests/e2e/data/gpt/tokens.u16 --threads 2 --steps 1000000 --log-every 1 "
                       "--eval-every 2 --eval-batches 1 --checkpoint-every 3 --keep 1 --checkpoint-dir {} "
                       "--metrics {}/metrics.jsonl",
                       trainer, dir, dir);
  }
};

// Each thread's name and signal masks (/proc/PID/task/TID/comm and status).
struct ThreadMasks {
  std::string thread;
  uint64_t blocked = 0, caught = 0;
};
std::vector<ThreadMasks> thread_masks(pid_t pid) {
  std::vector<ThreadMasks> out;
  for (const auto& task : fs::directory_iterator(fmt::format("/proc/{}/task", pid))) {
    ThreadMasks m;
    std::ifstream(task.path() / "comm") >> m.thread;
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("SigBlk:", 0) == 0) m.blocked = std::stoull(line.substr(7), nullptr, 16);
      if (line.rfind("SigCgt:", 0) == 0) m.caught = std::stoull(line.substr(7), nullptr, 16);
    }
    out.push_back(m);
  }
  return out;
}

constexpr uint64_t bit(int sig) { return uint64_t{1} << (sig - 1); }

}  // namespace

TEST_CASE("trainer signals: SIGINT and SIGTERM are blocked in every thread - no handler - one thread takes them") {
  Fixture f;
  Background run(f.command(f.tmp / "ckpt"), f.tmp / "out.txt");
  REQUIRE_MESSAGE(run.wait_for("  loss ", 60), run.output());
  const std::vector<ThreadMasks> threads = thread_masks(run.pid);
  CHECK(threads.size() >= 3);  // main, the pool's second worker, the signal thread
  int takers = 0;
  for (const ThreadMasks& t : threads) {
    CAPTURE(t.thread);
    CHECK((t.caught & (bit(SIGINT) | bit(SIGTERM))) == 0);
    // The signal thread, in sigwait, shows them unblocked (the kernel's
    // doing while it waits); every other thread has them blocked.
    if (t.thread == napkin::runtime::kStopSignalThreadName) {
      ++takers;
      continue;
    }
    CHECK((t.blocked & bit(SIGINT)) != 0);
    CHECK((t.blocked & bit(SIGTERM)) != 0);
  }
  CHECK(takers == 1);
  REQUIRE(::kill(run.pid, SIGINT) == 0);
  const int status = run.wait_status(60);
  INFO(run.output());
  CHECK(describe(status) == "exit 130");
}

TEST_CASE("trainer signals: SIGINT or SIGTERM at a random moment finishes the step - saves - exits 130 (24 trials)") {
  Fixture f;
  const unsigned seed = std::random_device{}();
  INFO("seed of the delays: " << seed);
  std::mt19937 random(seed);
  // Past the first progress line: in a step (0.1-0.2 s), an eval, a save or
  // a log line.
  std::uniform_int_distribution<int> delay_us(0, 400'000);
  for (int trial = 0; trial < 24; ++trial) {
    const int sig = trial % 2 == 0 ? SIGINT : SIGTERM;
    const int delay = delay_us(random);
    CAPTURE(trial);
    CAPTURE(sig);
    CAPTURE(delay);
    const std::string dir = f.tmp / fmt::format("ckpt{}", trial);
    Background run(f.command(dir), f.tmp / fmt::format("out{}.txt", trial));
    REQUIRE_MESSAGE(run.wait_for("  loss ", 60), run.output());
    std::this_thread::sleep_for(std::chrono::microseconds(delay));
    REQUIRE(::kill(run.pid, sig) == 0);
    const int status = run.wait_status(60);
    const std::string out = run.output();
    INFO(out.substr(out.size() > 2000 ? out.size() - 2000 : 0));
    REQUIRE(describe(status) == "exit 130");
    // "interrupted after step N; saved", and step N's checkpoint loads.
    const size_t at = out.find("interrupted after step ");
    REQUIRE(at != std::string::npos);
    const int64_t step = std::atoll(out.c_str() + at + 23);
    CHECK(out.find("; saved", at) != std::string::npos);
    const auto saved = napkin::runtime::list_checkpoints(dir);
    REQUIRE(!saved.empty());
    CHECK(saved.front().first == step);
    CHECK(napkin::runtime::verify_checkpoint(saved.front().second, f.hash).step == step);
  }
}
