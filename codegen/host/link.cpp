#include "codegen/host/link.h"

#include <stdlib.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "codegen/host/host_config.h"

namespace napkin::codegen::host {

std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

namespace {

// A directory only this build uses, beside `executable`, removed with
// everything in it when it goes out of scope, on every path.
class PrivateBuildDir {
 public:
  explicit PrivateBuildDir(const std::string& executable) {
    std::filesystem::path parent = std::filesystem::path(executable).parent_path();
    std::string name = ((parent.empty() ? std::filesystem::path(".") : parent) / ".napkin-build-XXXXXX").string();
    if (!::mkdtemp(name.data()))
      throw std::runtime_error("cannot write " + executable + ": cannot create a build directory beside it (" +
                               std::strerror(errno) + ")");
    path_ = name;
  }
  ~PrivateBuildDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  PrivateBuildDir(const PrivateBuildDir&) = delete;
  PrivateBuildDir& operator=(const PrivateBuildDir&) = delete;
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace

void link_executable(const std::string& object, const std::string& libraries, const std::string& executable) {
  PrivateBuildDir dir(executable);
  const std::string object_path = dir / "program.o", linked = dir / "program";
  write_file(object_path, object);
  std::string cmd = std::string(kLinkCompiler) + " -o " + shell_quoted(linked) + " " + shell_quoted(object_path) + " " +
                    libraries + " 2>&1";
  std::string output;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run the linker: " + cmd);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) output.append(buf.data(), n);
  int status = pclose(pipe);
  if (status != 0) throw std::runtime_error("linking the trainer failed:\n" + cmd + "\n" + output);
  if (std::rename(linked.c_str(), executable.c_str()) != 0)
    throw std::runtime_error("cannot write " + executable + " (" + std::strerror(errno) + ")");
}

}  // namespace napkin::codegen::host
