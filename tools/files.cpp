#include "tools/files.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "analysis/devices.h"

namespace napkin::tools {

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string fnv1a_hex(std::initializer_list<std::string_view> parts) {
  uint64_t h = 14695981039346656037ull;
  for (std::string_view part : parts)
    for (unsigned char c : part) h = (h ^ c) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

namespace {

// Whether `a` and `b` name the same file: the same device and inode, so that
// `./m.yaml`, a symbolic link to it and a hard link to it are all m.yaml.
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

std::string output_problem(const std::string& flag, const std::string& output, const std::vector<std::string>& inputs) {
  std::error_code ec;
  if (output.empty()) return fmt::format("{}: the output path is empty", flag);
  if (std::filesystem::is_directory(output, ec))
    return fmt::format("{} {}: is a directory; name the file to write, e.g. {}/{}", flag, output, output,
                       std::filesystem::path(inputs.empty() ? "out" : inputs.front()).stem().string());
  for (const std::string& in : inputs)
    if (!in.empty() && same_file(in, output))
      return fmt::format("{} {}: is also an input ({}); writing it would destroy it", flag, output, in);
  // Every command reads the local device file before it starts.
  if (const std::string devices = analysis::local_device_file(); !devices.empty() && same_file(devices, output))
    return fmt::format("{} {}: is the local device file every napkin command reads ({}); writing it would destroy it",
                       flag, output, devices);
  return "";
}

std::string input_problem(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return fmt::format("{}: cannot read ({})", path, std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return fmt::format("{}: is a directory; name the text files in it, e.g. {}/*.md", path, path);
  if (!S_ISREG(st.st_mode)) return fmt::format("{}: is not a regular file; napkin reads text from files only", path);
  return "";
}

std::string write_atomically(const std::string& path, const std::string& text) {
  std::string temp = path + ".tmp.XXXXXX";
  int fd = ::mkstemp(temp.data());
  if (fd < 0) return fmt::format("{}: cannot create a temporary file beside it ({})", path, std::strerror(errno));
  std::string error;
  size_t done = 0;
  while (done < text.size() && error.empty()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) error = fmt::format("{}: cannot write ({})", temp, std::strerror(errno));
    else done += size_t(n);
  }
  if (error.empty() && ::fchmod(fd, 0644) != 0) error = fmt::format("{}: cannot chmod ({})", temp, std::strerror(errno));
  if (error.empty() && ::fsync(fd) != 0) error = fmt::format("{}: cannot sync ({})", temp, std::strerror(errno));
  if (::close(fd) != 0 && error.empty()) error = fmt::format("{}: cannot close ({})", temp, std::strerror(errno));
  if (error.empty() && std::rename(temp.c_str(), path.c_str()) != 0)
    error = fmt::format("{}: cannot rename {} over it ({})", path, temp, std::strerror(errno));
  if (!error.empty()) ::unlink(temp.c_str());
  return error;
}

}  // namespace napkin::tools
