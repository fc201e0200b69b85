// Files, temporary directories, shell commands and runtime errors for tests.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "runtime/error.h"

namespace napkin::testing {

// A fresh directory under /tmp, removed with everything in it at scope exit.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = "/tmp/napkin-" + prefix + "-XXXXXX";
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The message of the runtime::Error `f` throws, or a note that it threw none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const runtime::Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct CommandResult {
  int status;       // the exit status; -1 if killed by a signal
  std::string out;  // stdout and stderr together
};

// Runs a shell command with the source tree as the working directory.
inline CommandResult run_in_source_tree(const std::string& command) {
  std::string cmd = std::string("cd ") + NAPKIN_SOURCE_DIR + " && " + command + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe);
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace napkin::testing
