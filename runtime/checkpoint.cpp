#include "runtime/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace napkin::runtime {

namespace {

constexpr const char* kFormat = "napkin-checkpoint-1";

// Slicing-by-8: table[k][b] is the CRC of byte b followed by k zero bytes, so
// eight bytes are folded per step with eight independent lookups.
constexpr auto kCrcTables = [] {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    t[0][i] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  return t;
}();

std::string checksum_text(uint32_t crc) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "crc32c:%08x", crc);
  return buf;
}

uint32_t data_checksum(const std::vector<TensorRef>& tensors) {
  uint32_t crc = 0;
  for (const TensorRef& t : tensors) {
    size_t bytes = safetensors_itemsize(t.dtype).value_or(0);
    for (int64_t d : t.shape) bytes *= static_cast<size_t>(d);
    crc = crc32c(t.data, bytes, crc);
  }
  return crc;
}

void verify_checksum(const SafetensorsFile& file, const std::string& expected) {
  const std::string actual = checksum_text(crc32c(file.data_section(), file.data_size()));
  if (actual != expected)
    throw Error(file.path() + ": checksum mismatch (file is corrupt): the metadata says " + expected +
                ", the data hashes to " + actual);
}

// The step of a file named step-<digits>.safetensors, else nullopt.
std::optional<int64_t> step_of(const std::string& filename) {
  constexpr std::string_view prefix = "step-", suffix = ".safetensors";
  if (filename.size() <= prefix.size() + suffix.size() || !filename.starts_with(prefix) ||
      !filename.ends_with(suffix))
    return std::nullopt;
  const std::string digits = filename.substr(prefix.size(), filename.size() - prefix.size() - suffix.size());
  if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(digits);
}

// (step, path) of every checkpoint in dir, newest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return found;
  if (ec) throw Error(dir + ": cannot list checkpoints: " + ec.message());
  for (const auto& entry : it) {
    auto step = step_of(entry.path().filename().string());
    if (step && entry.is_regular_file(ec)) found.emplace_back(*step, entry.path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  return found;
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    int err = errno;
    if (fd >= 0) ::close(fd);
    throw Error(dir + ": cannot sync the directory: " + std::strerror(err));
  }
  ::close(fd);
}

// Checks that `file` holds exactly the tensors of `refs` (names, dtypes,
// shapes), listing every difference in one Error, then copies them in.
void load_tensors(const SafetensorsFile& file, const std::vector<TensorRef>& refs) {
  std::vector<std::string> problems;
  std::set<std::string> expected;
  for (const TensorRef& r : refs) {
    if (!expected.insert(r.name).second) throw std::invalid_argument("load_tensors: '" + r.name + "' given twice");
    const SafetensorsFile::Tensor* t = file.find(r.name);
    if (!t)
      problems.push_back("missing: " + r.name + " (" + tensor_type_text(r.dtype, r.shape) + ")");
    else if (t->dtype != r.dtype || t->shape != r.shape)
      problems.push_back("wrong " + std::string(t->dtype != r.dtype ? "dtype" : "shape") + ": " + r.name + " is " +
                         tensor_type_text(t->dtype, t->shape) + " in the file, " + tensor_type_text(r.dtype, r.shape) +
                         " in this model");
  }
  for (const SafetensorsFile::Tensor& t : file.tensors())
    if (!expected.count(t.name))
      problems.push_back("unexpected: " + t.name + " (" + tensor_type_text(t.dtype, t.shape) + ") is not in this model");
  if (!problems.empty()) {
    std::string message = file.path() + ": does not match this model (" + std::to_string(problems.size()) +
                          (problems.size() == 1 ? " problem)" : " problems)");
    for (const std::string& p : problems) message += "\n  " + p;
    throw Error(message);
  }
  for (const TensorRef& r : refs) {
    const SafetensorsFile::Tensor* t = file.find(r.name);
    if (t->bytes > 0) std::memcpy(r.data, t->data, t->bytes);
  }
}

}  // namespace

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
  const auto& t = kCrcTables;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian: byte 0 is the low byte
    w ^= crc;
    crc = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
          t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
  }
  for (; bytes > 0; --bytes) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

std::string checkpoint_filename(int64_t step) {
  if (step < 0) throw std::invalid_argument("checkpoint_filename: negative step");
  char buf[64];
  std::snprintf(buf, sizeof buf, "step-%06" PRId64 ".safetensors", step);
  return buf;
}

std::string write_checkpoint(const std::string& dir, int64_t step, const std::vector<TensorRef>& tensors,
                             const std::string& model_hash, const std::map<std::string, std::string>& metadata,
                             int keep) {
  std::map<std::string, std::string> meta = metadata;
  for (const char* key : {"format", "model_hash", "step", "checksum"})
    if (meta.count(key)) throw std::invalid_argument(std::string("write_checkpoint: metadata key '") + key + "' is reserved");
  std::vector<TensorData> views;
  for (const TensorRef& t : tensors) views.push_back({t.name, t.dtype, t.shape, t.data});
  meta["format"] = kFormat;
  meta["model_hash"] = model_hash;
  meta["step"] = std::to_string(step);
  meta["checksum"] = checksum_text(data_checksum(tensors));

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create the checkpoint directory: " + ec.message());
  const std::string path = dir + "/" + checkpoint_filename(step);
  std::string tmp = dir + "/.tmp-" + checkpoint_filename(step) + "-XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw Error(path + ": cannot create a temporary file in " + dir + ": " + std::strerror(errno));
  try {
    auto fail = [&](const char* what) { throw Error(path + ": cannot " + what + ": " + std::strerror(errno)); };
    if (::fchmod(fd, 0644) != 0) fail("set permissions");  // mkstemp makes it 0600
    write_safetensors(fd, path, views, meta);
    if (::fsync(fd) != 0) fail("sync to disk");
    int closed = ::close(fd);
    fd = -1;
    if (closed != 0) fail("write");
    if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("rename the temporary file into place");
    fsync_directory(dir);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }

  if (keep > 0) {
    auto all = list_checkpoints(dir);
    for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i)
      if (::unlink(all[i].second.c_str()) != 0 && errno != ENOENT)
        throw Error(all[i].second + ": cannot delete this old checkpoint: " + std::strerror(errno));
  }
  return path;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  auto all = list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.front().second;
}

std::map<std::string, std::string> read_checkpoint(const std::string& path, const std::vector<TensorRef>& into,
                                                   const std::string& expected_model_hash) {
  SafetensorsFile file(path);
  const auto& meta = file.metadata();
  auto get = [&](const char* key) {
    auto it = meta.find(key);
    if (it == meta.end()) throw Error(path + ": not a napkin checkpoint (no '" + std::string(key) + "' in its metadata)");
    return it->second;
  };
  if (get("format") != kFormat)
    throw Error(path + ": checkpoint format '" + get("format") + "' is not " + kFormat);
  verify_checksum(file, get("checksum"));
  if (get("model_hash") != expected_model_hash)
    throw Error(path + ": checkpoint was written by a different model (hash " + get("model_hash") + ", this trainer " +
                expected_model_hash + ")");
  (void)get("step");  // the trainer resumes from it, so it must be there
  load_tensors(file, into);
  return meta;
}

void read_weights(const std::string& path, const std::vector<TensorRef>& params) {
  SafetensorsFile file(path);
  if (auto it = file.metadata().find("checksum"); it != file.metadata().end()) verify_checksum(file, it->second);
  load_tensors(file, params);
}

}  // namespace napkin::runtime
