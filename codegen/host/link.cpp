#include "codegen/host/link.h"

#include <array>
#include <cstdio>
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

void link_executable(const std::string& inputs, const std::string& executable) {
  std::string cmd = std::string(kLinkCompiler) + " -o " + shell_quoted(executable) + " " + inputs + " 2>&1";
  std::string output;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run the linker: " + cmd);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) output.append(buf.data(), n);
  int status = pclose(pipe);
  if (status != 0) throw std::runtime_error("linking the trainer failed:\n" + cmd + "\n" + output);
}

}  // namespace napkin::codegen::host
