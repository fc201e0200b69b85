#include "runtime/communicator.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "runtime/error.h"

namespace napkin::runtime {

// Defined in runtime/mpi_communicator.cpp.
std::unique_ptr<Communicator> open_mpi_communicator(const LaunchedRank& launched);

namespace {

// What the watchdog and signal handlers print: two buffers, so that a
// handler reads a whole one while set_activity writes the other.
char g_activity[2][256] = {{0}, {0}};
std::atomic<int> g_activity_current{0};
std::atomic<bool> g_in_collective{false};
std::atomic<int64_t> g_collective_since_ns{0};
std::atomic<const char*> g_collective_what{""};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "one process"; }
  void all_reduce_sum(float*, int64_t) override {}
  void all_reduce_sum(double*, int64_t) override {}
  void reduce_scatter_sum(float*, const std::vector<int64_t>&) override {}  // its part is all of it, in place
  void reduce_sum(const float* mine, float* sum, int64_t count, int) override {
    if (mine != sum) std::memmove(sum, mine, static_cast<size_t>(count) * sizeof(float));
  }
  void all_gather(const void* mine, int64_t bytes, void* all) override {
    std::memcpy(all, mine, static_cast<size_t>(bytes));
  }
  void broadcast(void*, int64_t, int) override {}
  void send(const void*, int64_t, int) override { throw std::logic_error("send in a single process"); }
  void receive(void*, int64_t, int) override { throw std::logic_error("receive in a single process"); }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<SingleProcess>(); }
  [[noreturn]] void abort(int status) override { std::_Exit(status); }
};

// Ends the process when one collective has waited `timeout` seconds. A
// detached thread: it lives as long as the process.
void start_watchdog(double timeout) {
  std::thread([timeout] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (!g_in_collective.load()) continue;
      double waited = static_cast<double>(now_ns() - g_collective_since_ns.load()) * 1e-9;
      if (waited < timeout || !g_in_collective.load()) continue;
      write_stderr_line(fmt::format(
          "error: {}: waited {:.0f} s in {} for the other ranks (--collective-timeout {:.0f}): one of them hung or "
          "died; ending the job. Checkpoints are written whole or not at all: --resume continues from the last one",
          g_activity[g_activity_current.load()], waited, g_collective_what.load(), timeout));
      std::_Exit(1);
    }
  }).detach();
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return fallback;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return *end == 0 && n >= 0 && n < (1L << 30) ? static_cast<int>(n) : fallback;
}

}  // namespace

void write_stderr_line(const std::string& line) {
  std::string whole = line + "\n";
  ssize_t ignored = ::write(2, whole.data(), whole.size());
  (void)ignored;
}

void Communicator::set_activity(const std::string& activity) {
  int next = 1 - g_activity_current.load();
  std::string text = size() > 1 ? fmt::format("rank {} of {}, {}", rank(), size(), activity) : activity;
  std::snprintf(g_activity[next], sizeof g_activity[next], "%s", text.c_str());
  g_activity_current.store(next);
}

bool Communicator::in_collective() { return g_in_collective.load(); }

void Communicator::write_stopped_by_signal(int sig) {
  // No allocation, no stdio: plain copies into a stack buffer, one write(2).
  char line[1024];
  size_t n = 0;
  auto add = [&](const char* s) {
    for (; *s && n < sizeof line - 1; ++s) line[n++] = *s;
  };
  add("error: ");
  add(g_activity[g_activity_current.load()]);
  add(sig == SIGINT ? ": stopped by SIGINT" : ": stopped by SIGTERM");
  add(" while waiting for the other ranks: the launcher is ending the job (another rank failed, or the job was "
      "interrupted). Checkpoints are written whole or not at all: --resume continues from the last one\n");
  ssize_t ignored = ::write(2, line, n);
  (void)ignored;
}

thread_local bool t_in_background = false;

void Communicator::in_background() { t_in_background = true; }

Communicator::Waiting::Waiting(const char* what) {
  if (t_in_background) return;
  g_collective_what.store(what);
  g_collective_since_ns.store(now_ns());
  g_in_collective.store(true);
}

Communicator::Waiting::~Waiting() {
  if (!t_in_background) g_in_collective.store(false);
}

LaunchedRank launched_rank() {
  LaunchedRank r;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    r = {env_int("OMPI_COMM_WORLD_RANK", 0), env_int("OMPI_COMM_WORLD_SIZE", 1), 0, "mpirun"};
  } else if (std::getenv("PMIX_RANK") && std::getenv("SLURM_NTASKS")) {
    r = {env_int("PMIX_RANK", 0), env_int("SLURM_NTASKS", 1), 0, "srun"};
  } else if (std::getenv("SLURM_PROCID") && std::getenv("SLURM_NTASKS") && std::getenv("SLURM_STEP_ID")) {
    r = {env_int("SLURM_PROCID", 0), env_int("SLURM_NTASKS", 1), 0, "srun"};
  }
  if (r.size < 1) r.size = 1;
  r.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("SLURM_LOCALID", 0));
  return r;
}

std::unique_ptr<Communicator> open_communicator(double timeout_seconds) {
  LaunchedRank launched = launched_rank();
  if (launched.size <= 1) return std::make_unique<SingleProcess>();
  std::unique_ptr<Communicator> comm = open_mpi_communicator(launched);
  if (timeout_seconds > 0) start_watchdog(timeout_seconds);
  return comm;
}

}  // namespace napkin::runtime
