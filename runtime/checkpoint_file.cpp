#include "runtime/checkpoint_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdio>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <stdexcept>

#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace napkin::runtime {

namespace {

constexpr const char* kFormatPrefix = "napkin-checkpoint-";
constexpr int kFormatVersion = 2;

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

// The header's content as checkpoint.h defines it: length-prefixed strings,
// so no choice of names or values can make two headers hash alike by shifting
// a separator.
class HeaderDigest {
 public:
  void add(const std::string& s) {
    uint64_t n = s.size();
    for (int i = 0; i < 8; ++i) text_ += static_cast<char>((n >> (8 * i)) & 0xff);
    text_ += s;
  }
  void add_tensor(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape) {
    add(name);
    add(dtype);
    std::string dims;
    for (size_t i = 0; i < shape.size(); ++i) dims += (i ? "," : "") + std::to_string(shape[i]);
    add(dims);
  }
  void add_metadata(const std::map<std::string, std::string>& meta) {
    for (const auto& [key, value] : meta)
      if (key != "checksum") add(key), add(value);
  }
  uint32_t crc() const { return crc32c(text_.data(), text_.size()); }

 private:
  std::string text_;
};

void verify_checksum(const SafetensorsFile& file, const CheckpointHeader& h) {
  uint32_t crc = 0;
  if (h.format >= 2) {
    HeaderDigest digest;
    digest.add_metadata(file.metadata());
    for (const SafetensorsFile::Tensor& t : file.tensors()) digest.add_tensor(t.name, t.dtype, t.shape);
    crc = digest.crc();
  }
  const std::string actual = checksum_text(crc32c(file.data_section(), file.data_size(), crc));
  const std::string& expected = h.metadata.at("checksum");
  if (actual != expected)
    throw Error(file.path() + ": checksum mismatch (file is corrupt): the metadata says " + expected +
                ", the " + (h.format >= 2 ? "header and data hash" : "data hashes") + " to " + actual);
}

// A whole number of at most `max_digits` decimal digits, else nullopt.
std::optional<uint64_t> whole_number(const std::string& s, size_t max_digits) {
  if (s.empty() || s.size() > max_digits || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

CheckpointHeader parse_header(const SafetensorsFile& file) {
  const std::string& path = file.path();
  CheckpointHeader h;
  h.path = path;
  h.metadata = file.metadata();
  auto get = [&](const char* key) -> const std::string& {
    auto it = h.metadata.find(key);
    if (it == h.metadata.end()) throw Error(path + ": not a napkin checkpoint (no '" + std::string(key) + "' in its metadata)");
    return it->second;
  };
  auto bad = [&](const char* key, const std::string& why) {
    return Error(path + ": metadata '" + key + "' is \"" + printable(h.metadata.at(key)) + "\", " + why +
                 " (the file was edited or damaged)");
  };
  const std::string& format = get("format");
  if (format == "napkin-checkpoint-1") h.format = 1;
  else if (format == "napkin-checkpoint-2") h.format = 2;
  else
    throw Error(path + ": checkpoint format '" + printable(format) + "' is not one this trainer reads (" + kFormatPrefix +
                "1 or " + kFormatPrefix + "2)");
  h.model_hash = get("model_hash");
  if (h.model_hash.empty() || printable(h.model_hash, 128) != h.model_hash) throw bad("model_hash", "not a model hash");
  const std::string& checksum = get("checksum");
  if (checksum.size() != 15 || !checksum.starts_with("crc32c:") ||
      checksum.find_first_not_of("0123456789abcdef", 7) != std::string::npos)
    throw bad("checksum", "not crc32c: and 8 hex digits");
  std::optional<uint64_t> step = whole_number(get("step"), 18);
  if (!step) throw bad("step", "not a step count (a whole number from 0 to 10^18)");
  h.step = static_cast<int64_t>(*step);
  if (h.metadata.count("seed")) {
    h.seed = whole_number(h.metadata.at("seed"), 20);
    if (!h.seed) throw bad("seed", "not a seed (a whole number from 0 to 2^64 - 1)");
  }
  if (h.format >= 2) {
    h.run = get("run");
    if (h.run.empty() || h.run.size() > 64 || h.run.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw bad("run", "not a run id (hex digits)");
  }
  return h;
}

// What the checkpoint's run was built with that `built` was not (its
// --dims, its --memory-budget), "" where it records the same or nothing (a
// checkpoint of an older napkin).
std::string build_difference(const CheckpointHeader& h, const StepBuild& built) {
  auto recorded = [&](const char* key) -> std::optional<std::string> {
    auto it = h.metadata.find(key);
    if (it == h.metadata.end()) return std::nullopt;
    return it->second;
  };
  std::vector<std::string> differences;
  if (auto dims = recorded(kDimsKey); dims && *dims != built.dims)
    differences.push_back(fmt::format("its run was built at {}, this one at {}",
                                      dims->empty() ? "the model file's own dims" : "--dims " + printable(*dims, 200),
                                      built.dims.empty() ? "the model file's own dims" : "--dims " + built.dims));
  if (auto budget = recorded(kMemoryBudgetKey); budget && *budget != std::to_string(built.memory_budget)) {
    auto said = [](const std::string& bytes) {
      return bytes == "0" ? std::string("no --memory-budget") : "--memory-budget " + printable(bytes, 40) + " bytes";
    };
    differences.push_back(fmt::format("its run was trained under {}, this one is built under {}", said(*budget),
                                      said(std::to_string(built.memory_budget))));
  }
  std::string out;
  for (const std::string& d : differences) out += (out.empty() ? "" : "; ") + d;
  return out;
}

// Another program's safetensors file: its checksum verified when it has one.
void verify_foreign_checksum(const SafetensorsFile& file) {
  if (!file.metadata().count("checksum")) return;
  CheckpointHeader plain;
  plain.metadata = file.metadata();
  verify_checksum(file, plain);
}

}  // namespace

CheckpointHeader verify_checkpoint_file(const SafetensorsFile& file, const std::string& expected_model_hash,
                                        const std::string& hint, const StepBuild* built) {
  CheckpointHeader h = parse_header(file);
  verify_checksum(file, h);
  if (h.model_hash != expected_model_hash) {
    std::string difference = built ? build_difference(h, *built) : "";
    throw Error(file.path() + ": checkpoint was written by a different model (hash " + h.model_hash +
                ", this trainer " + expected_model_hash + ")" +
                (difference.empty() ? "" : "\n    the settings differ: " + difference) +
                (hint.empty() ? "" : "\n    hint: " + hint));
  }
  return h;
}

std::vector<std::string> load_checkpoint_tensors(const std::string& source, const std::vector<const SafetensorsFile*>& files,
                                                 const std::vector<TensorRef>& refs,
                                                 const std::vector<std::string>& ignorable) {
  auto find = [&](const std::string& name) -> const SafetensorsFile::Tensor* {
    for (const SafetensorsFile* f : files)
      if (const SafetensorsFile::Tensor* t = f->find(name)) return t;
    return nullptr;
  };
  std::vector<std::string> problems, ignored;
  std::set<std::string> expected;
  const std::set<std::string> skip(ignorable.begin(), ignorable.end());
  for (const TensorRef& r : refs) {
    if (!expected.insert(r.name).second) throw std::invalid_argument("load_checkpoint_tensors: '" + r.name + "' given twice");
    const SafetensorsFile::Tensor* t = find(r.name);
    if (!t)
      problems.push_back("missing: " + r.name + " (" + tensor_type_text(r.dtype, r.shape) + ")");
    else if (t->dtype != r.dtype || t->shape != r.shape)
      problems.push_back("wrong " + std::string(t->dtype != r.dtype ? "dtype" : "shape") + ": " + r.name + " is " +
                         tensor_type_text(t->dtype, t->shape) + " in the file, " + tensor_type_text(r.dtype, r.shape) +
                         " in this model");
  }
  for (const SafetensorsFile* file : files)
    for (const SafetensorsFile::Tensor& t : file->tensors()) {
      if (expected.count(t.name)) continue;
      if (skip.count(t.name)) ignored.push_back(t.name);
      else problems.push_back("unexpected: " + printable(t.name) + " (" + tensor_type_text(t.dtype, t.shape) + ") is not in this model");
    }
  if (!problems.empty()) {
    std::string message = source + ": does not match this model (" + std::to_string(problems.size()) +
                          (problems.size() == 1 ? " problem)" : " problems)");
    for (const std::string& p : problems) message += "\n  " + p;
    throw Error(message);
  }
  for (const TensorRef& r : refs) {
    const SafetensorsFile::Tensor* t = find(r.name);
    if (t->bytes > 0) std::memcpy(r.data, t->data, t->bytes);
  }
  for (const SafetensorsFile* file : files) file->check_intact();  // a file without a checksum could otherwise load zeros unseen
  return ignored;
}

bool is_napkin_checkpoint(const SafetensorsFile& file) {
  return file.metadata().count("format") && file.metadata().at("format").starts_with(kFormatPrefix);
}

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

std::optional<int64_t> checkpoint_step(const std::string& filename) {
  constexpr std::string_view prefix = "step-", suffix = ".safetensors";
  if (filename.size() <= prefix.size() + suffix.size() || !filename.starts_with(prefix) ||
      !filename.ends_with(suffix))
    return std::nullopt;
  const std::string digits = filename.substr(prefix.size(), filename.size() - prefix.size() - suffix.size());
  std::optional<uint64_t> step = whole_number(digits, 18);
  if (!step) return std::nullopt;
  return static_cast<int64_t>(*step);
}

std::string printable(const std::string& text, size_t max_chars) {
  std::string out;
  for (unsigned char c : text) {
    if (out.size() >= max_chars) return out + "...";
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string write_checkpoint(const std::string& dir, int64_t step, const std::vector<TensorRef>& tensors,
                             const std::string& model_hash, const std::string& run,
                             const std::map<std::string, std::string>& metadata) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create the checkpoint directory: " + ec.message());
  const std::string path = dir + "/" + checkpoint_filename(step);
  write_checkpoint_file(path, step, tensors, model_hash, run, metadata);
  return path;
}

void write_checkpoint_file(const std::string& path, int64_t step, const std::vector<TensorRef>& tensors,
                           const std::string& model_hash, const std::string& run,
                           const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> meta = metadata;
  for (const char* key : {"format", "model_hash", "run", "step", "checksum"})
    if (meta.count(key)) throw std::invalid_argument(std::string("write_checkpoint: metadata key '") + key + "' is reserved");
  meta["format"] = kFormatPrefix + std::to_string(kFormatVersion);
  meta["model_hash"] = model_hash;
  meta["run"] = run;
  meta["step"] = std::to_string(step);
  std::vector<TensorData> views;
  HeaderDigest digest;
  digest.add_metadata(meta);
  for (const TensorRef& t : tensors) {
    views.push_back({t.name, t.dtype, t.shape, t.data});
    digest.add_tensor(t.name, t.dtype, t.shape);
  }
  uint32_t crc = digest.crc();
  for (const TensorRef& t : tensors) {
    size_t bytes = safetensors_itemsize(t.dtype).value_or(0);
    for (int64_t d : t.shape) bytes *= static_cast<size_t>(d);
    crc = crc32c(t.data, bytes, crc);
  }
  meta["checksum"] = checksum_text(crc);
  write_safetensors_file_atomically(path, views, meta);
}

std::map<std::string, std::string> build_metadata(const StepBuild& build) {
  return {{kDimsKey, build.dims}, {kMemoryBudgetKey, std::to_string(build.memory_budget)}};
}

CheckpointHeader read_checkpoint_file_header(const std::string& path) { return parse_header(SafetensorsFile(path)); }

void verify_safetensors_checksum(const SafetensorsFile& file) {
  if (is_napkin_checkpoint(file))
    verify_checksum(file, parse_header(file));
  else
    verify_foreign_checksum(file);
}

}  // namespace napkin::runtime
