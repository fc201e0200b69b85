#include "tools/byte_tokens.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tools/files.h"

namespace napkin::tools {

int64_t write_byte_tokens(const std::vector<std::string>& inputs, const std::string& output, std::string& error) {
  if (error = output_problem("-o", output, inputs); !error.empty()) return -1;
  std::string bytes;
  for (const std::string& path : inputs) {
    error = input_problem(path);  // before opening: opening a FIFO blocks
    if (error.empty() && !std::ifstream(path, std::ios::binary))
      error = fmt::format("{}: cannot read ({})", path, std::strerror(errno));
    if (!error.empty()) return -1;
    bytes += read_file_bytes(path);
  }
  std::vector<uint16_t> tokens(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) tokens[i] = static_cast<unsigned char>(bytes[i]);
  std::filesystem::path out(output);
  std::error_code ec;
  if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path(), ec);
  std::string tmp = output + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
    f.close();
    if (!f) {
      std::filesystem::remove(tmp, ec);
      error = fmt::format("{}: cannot write", output);
      return -1;
    }
  }
  std::filesystem::rename(tmp, output, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    error = fmt::format("{}: cannot write ({})", output, ec.message());
    return -1;
  }
  return static_cast<int64_t>(tokens.size());
}

}  // namespace napkin::tools
