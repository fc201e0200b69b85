#include "support/cuda_emulator.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

extern char** environ;

namespace napkin::testing {

namespace {

namespace fs = std::filesystem;

// A fresh directory under the system's temporary directory, removed with
// everything in it when this goes out of scope.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "napkin-cuda-emu-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("CUDA emulation: cannot create a temporary directory");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `args` (args[0] looked up in PATH) with stdout and stderr into `log`;
// its exit status, or -1 when it could not start or was killed.
int run_logged(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace

CudaEmulator::CudaEmulator(const std::string& source) {
  TempDir dir;
  fs::path cu = dir.path() / "kernels.cu", so = dir.path() / "kernels.so", log = dir.path() / "compiler.log";
  {
    std::ofstream out(cu);
    out << source;
    if (!out) throw std::runtime_error(fmt::format("CUDA emulation: cannot write {}", cu.string()));
  }
  const std::string shim = std::string(NAPKIN_SOURCE_DIR) + "/tests/support/cuda_host_shim.h";
  const std::vector<std::string> command = {"g++", "-std=c++17", "-O1", "-fPIC", "-shared", "-fno-strict-aliasing",
                                            "-DNAPKIN_HOST_EMULATION", "-include", shim, "-x", "c++",
                                            cu.string(), "-o", so.string()};
  int status = run_logged(command, log);
  if (status != 0) {
    throw std::runtime_error(fmt::format("CUDA emulation: the host compiler {} compiling the kernel source:\n{}",
                                         status < 0 ? "could not run (g++ not in PATH?) or died"
                                                    : fmt::format("failed (exit status {})", status),
                                         read_file(log)));
  }
  library_ = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) throw std::runtime_error(fmt::format("CUDA emulation: dlopen: {}", dlerror()));
  launch_ = reinterpret_cast<LaunchEntry>(symbol("napkin_emu_launch", "the shim's entry point"));
  last_error_ = reinterpret_cast<ErrorEntry>(symbol("napkin_emu_last_error", "the shim's entry point"));
}

CudaEmulator::~CudaEmulator() {
  if (library_ != nullptr) dlclose(library_);
}

void* CudaEmulator::symbol(const std::string& name, const char* what) {
  dlerror();
  void* address = dlsym(library_, name.c_str());
  if (address == nullptr)
    throw std::runtime_error(fmt::format("CUDA emulation: the kernel source has no {} '{}'", what, name));
  return address;
}

void CudaEmulator::launch(const std::string& function, int64_t grid, int block, int shared_bytes, char* arena,
                          char* scratch, const std::vector<int64_t>& offsets) {
  if (reinterpret_cast<uintptr_t>(arena) % 16 != 0 || reinterpret_cast<uintptr_t>(scratch) % 16 != 0)
    throw std::runtime_error(fmt::format("CUDA emulation: launching '{}': arena and scratch must be 16-byte aligned",
                                         function));
  auto kernel = reinterpret_cast<Kernel>(symbol(function, "__global__ function"));
  const std::vector<long long> off(offsets.begin(), offsets.end());  // NapkinOffsets<N>'s layout
  launch_(kernel, grid, block, shared_bytes, arena, scratch, off.empty() ? nullptr : off.data(), function.c_str());
  if (const char* error = last_error_()) throw std::runtime_error(error);
}

void* CudaEmulator::global(const std::string& name) { return symbol(name, "__device__ variable"); }

}  // namespace napkin::testing
