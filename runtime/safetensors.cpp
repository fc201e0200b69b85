#include "runtime/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace napkin::runtime {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; the runtime copies it without swapping");

namespace {

struct Dtype {
  const char* napkin;
  const char* file;
  size_t itemsize;
};

constexpr Dtype kDtypes[] = {
    {"f64", "F64", 8},         {"f32", "F32", 4},         {"f16", "F16", 2}, {"bf16", "BF16", 2},
    {"f8e4m3", "F8_E4M3", 1},  {"f8e5m2", "F8_E5M2", 1},  {"i64", "I64", 8}, {"i32", "I32", 4},
    {"i16", "I16", 2},         {"i8", "I8", 1},           {"u64", "U64", 8}, {"u32", "U32", 4},
    {"u16", "U16", 2},         {"u8", "U8", 1},           {"bool", "BOOL", 1},
};

const Dtype* by_napkin_name(std::string_view name) {
  for (const Dtype& d : kDtypes)
    if (name == d.napkin) return &d;
  return nullptr;
}

const Dtype* by_file_name(std::string_view name) {
  for (const Dtype& d : kDtypes)
    if (name == d.file) return &d;
  return nullptr;
}

// numel * itemsize, or nullopt on overflow.
std::optional<size_t> byte_count(const std::vector<int64_t>& shape, size_t itemsize) {
  size_t n = itemsize;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, static_cast<size_t>(d), &n)) return std::nullopt;
  return n;
}

}  // namespace

void write_all(int fd, const std::string& path, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(path + ": cannot write: " + std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
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

std::optional<size_t> safetensors_itemsize(std::string_view dtype) {
  const Dtype* d = by_napkin_name(dtype);
  return d ? std::optional(d->itemsize) : std::nullopt;
}

std::string tensor_type_text(std::string_view dtype, const std::vector<int64_t>& shape) {
  std::string s = std::string(dtype) + "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void write_safetensors(int fd, const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the header in file order: metadata, then the tensors as laid out.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<size_t> sizes;
  size_t offset = 0;
  for (const TensorData& t : tensors) {
    const Dtype* d = by_napkin_name(t.dtype);
    if (!d) throw std::invalid_argument("write_safetensors: tensor '" + t.name + "' has dtype " + t.dtype +
                                        ", which safetensors cannot hold");
    if (t.name == "__metadata__" || header.contains(t.name))
      throw std::invalid_argument("write_safetensors: tensor name '" + t.name + "' is used twice or reserved");
    std::optional<size_t> bytes = byte_count(t.shape, d->itemsize);
    if (!bytes) throw std::invalid_argument("write_safetensors: tensor '" + t.name + "' has a bad shape");
    header[t.name] = {{"dtype", d->file}, {"shape", t.shape}, {"data_offsets", {offset, offset + *bytes}}};
    sizes.push_back(*bytes);
    offset += *bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  write_all(fd, path, length, 8);
  write_all(fd, path, text.data(), text.size());
  for (size_t i = 0; i < tensors.size(); ++i) write_all(fd, path, tensors[i].data, sizes[i]);
}

void write_safetensors_file(const std::string& path, const std::vector<TensorData>& tensors,
                            const std::map<std::string, std::string>& metadata) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(path + ": cannot create: " + std::strerror(errno));
  try {
    write_safetensors(fd, path, tensors, metadata);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw Error(path + ": cannot write: " + std::strerror(errno));
}

void write_safetensors_file_atomically(const std::string& path, const std::vector<TensorData>& tensors,
                                       const std::map<std::string, std::string>& metadata) {
  const std::filesystem::path target(path);
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  std::string tmp = dir + "/.tmp-" + target.filename().string() + "-XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw Error(path + ": cannot create a temporary file in " + dir + ": " + std::strerror(errno));
  try {
    auto fail = [&](const char* what) { throw Error(path + ": cannot " + what + ": " + std::strerror(errno)); };
    if (::fchmod(fd, 0644) != 0) fail("set permissions");  // mkstemp makes it 0600
    write_safetensors(fd, path, tensors, metadata);
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
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const std::string& p = file_.path();
  const size_t size = file_.size();
  if (size < 8)
    throw Error(p + ": truncated: " + std::to_string(size) + " bytes, not even the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(file_.data()[i]);
  if (header_len > size - 8)
    throw Error(p + ": header length " + std::to_string(header_len) + " exceeds the " + std::to_string(size - 8) +
                " bytes after it (truncated, or not a safetensors file)");
  data_ = file_.data() + 8 + header_len;
  data_size_ = size - 8 - header_len;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file_.data() + 8, data_);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(p + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw Error(p + ": header is not a JSON object");

  struct Range {
    size_t begin, end;
    size_t tensor;
  };
  std::vector<Range> ranges;
  for (const auto& [name, info] : header.items()) {
    const std::string where = p + ": tensor '" + name + "'";
    if (name == "__metadata__") {
      if (!info.is_object()) throw Error(p + ": __metadata__ is not an object");
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) throw Error(p + ": __metadata__ entry '" + key + "' is not a string");
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    if (!info.is_object()) throw Error(where + " is not an object");
    if (!info.contains("dtype") || !info["dtype"].is_string()) throw Error(where + " has no dtype string");
    const std::string file_dtype = info["dtype"].get<std::string>();
    const Dtype* d = by_file_name(file_dtype);
    if (!d) throw Error(where + " has unknown or unsupported dtype '" + file_dtype + "'");
    if (!info.contains("shape") || !info["shape"].is_array()) throw Error(where + " has no shape array");
    std::vector<int64_t> shape;
    for (const auto& dim : info["shape"]) {
      if (!dim.is_number_unsigned()) throw Error(where + ": shape " + info["shape"].dump() + " is not a list of sizes");
      shape.push_back(dim.get<int64_t>());
    }
    const auto& offsets = info.contains("data_offsets") ? info["data_offsets"] : nlohmann::json();
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      throw Error(where + " has no data_offsets [begin, end]");
    const size_t begin = offsets[0].get<size_t>(), end = offsets[1].get<size_t>();
    std::optional<size_t> bytes = byte_count(shape, d->itemsize);
    if (!bytes) throw Error(where + ": shape " + info["shape"].dump() + " is too large");
    if (end < begin || end - begin != *bytes)
      throw Error(where + ": " + tensor_type_text(d->napkin, shape) + " needs " + std::to_string(*bytes) +
                  " bytes, but data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] span " +
                  (end < begin ? "a negative range" : std::to_string(end - begin)));
    ranges.push_back({begin, end, tensors_.size()});
    tensors_.push_back({name, d->napkin, std::move(shape), nullptr, *bytes});
  }

  // The ranges must tile [0, data_size_) exactly, in some order.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  size_t covered = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    const std::string& name = tensors_[r.tensor].name;
    if (r.begin != covered) {
      const std::string before = i == 0 ? "the data section starts at 0" : "'" + tensors_[ranges[i - 1].tensor].name +
                                                                             "' ends at " + std::to_string(covered);
      throw Error(p + ": tensor '" + name + "' starts at byte " + std::to_string(r.begin) + " of the data, but " +
                  before + " (tensors must be laid out without gaps or overlaps)");
    }
    covered = r.end;
  }
  if (covered > data_size_)
    throw Error(p + ": truncated: the header describes " + std::to_string(covered) + " bytes of tensor data, the file holds " +
                std::to_string(data_size_));
  if (covered < data_size_)
    throw Error(p + ": " + std::to_string(data_size_ - covered) + " bytes after the last tensor (the header describes " +
                std::to_string(covered) + " bytes of data, the file holds " + std::to_string(data_size_) + ")");

  std::vector<Tensor> in_order;
  for (const Range& r : ranges) {
    in_order.push_back(std::move(tensors_[r.tensor]));
    in_order.back().data = data_ + r.begin;
  }
  tensors_ = std::move(in_order);
}

const SafetensorsFile::Tensor* SafetensorsFile::find(std::string_view name) const {
  for (const Tensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace napkin::runtime
