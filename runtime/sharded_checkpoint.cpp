#include "runtime/sharded_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "runtime/mapped_file.h"
#include "runtime/safetensors.h"

namespace napkin::runtime {

namespace {

constexpr const char* kIndexName = "index.json";
constexpr const char* kIndexFormat = "napkin-sharded-checkpoint-1";
constexpr const char* kShardRankKey = "shard_rank";
constexpr const char* kShardRanksKey = "shard_ranks";

std::string crc_text(uint32_t crc) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "crc32c:%08x", crc);
  return buf;
}

// The size and CRC-32C of the whole file at `path`, read in chunks: a
// mapping's pages would count in the rank's resident memory (a shard's
// size at its peak, measured), the page cache's do not.
ShardFile measure(const std::string& path) {
  ShardFile f;
  f.name = std::filesystem::path(path).filename().string();
  // O_NONBLOCK: a FIFO in a shard's place must not block the open (a regular file's reads ignore it).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file (it is " + file_kind(st.st_mode) + ")");
  }
  std::vector<char> chunk(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw Error(path + ": cannot read: " + std::strerror(err));
    }
    if (n == 0) break;
    f.crc = crc32c(chunk.data(), static_cast<size_t>(n), f.crc);
    f.bytes += n;
  }
  ::close(fd);
  return f;
}

// Writes `text` to `path` and syncs it (inside the temporary: the rename that
// publishes it comes after).
void write_synced(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  auto fail = [&](const char* what) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw Error(path + ": cannot " + what + ": " + std::strerror(err));
  };
  if (fd < 0) fail("create");
  try {
    write_all(fd, path, text.data(), text.size());
  } catch (const Error&) {
    ::close(fd);
    throw;
  }
  if (::fsync(fd) != 0) fail("sync to disk");
  if (::close(fd) != 0) throw Error(path + ": cannot write: " + std::strerror(errno));
}

// The index's problem with `dir`, as an Error.
Error bad_index(const std::string& dir, const std::string& why) {
  return Error(dir + "/" + kIndexName + ": " + why + " (the sharded checkpoint is damaged, or not one napkin wrote)");
}

// A file of a sharded checkpoint, opened and checked against its index.
class Shard {
 public:
  Shard(const std::string& dir, const ShardedIndex& index, int rank, const std::string& expected_model_hash,
        const std::string& hint, const StepBuild* built)
      : path_(dir + "/" + index.files[static_cast<size_t>(rank)].name) {
    const ShardFile& listed = index.files[static_cast<size_t>(rank)];
    std::error_code ec;
    if (!std::filesystem::exists(path_, ec))
      throw Error(path_ + ": missing: the sharded checkpoint " + dir + " lacks rank " + std::to_string(rank) +
                  "'s file (" + std::to_string(index.ranks) + " ranks wrote it); it cannot be loaded");
    const ShardFile found = measure(path_);
    if (found.bytes != listed.bytes)
      throw Error(path_ + ": " + std::to_string(found.bytes) + " bytes, " + kIndexName + " says " +
                  std::to_string(listed.bytes) + " (the file is damaged, or another checkpoint's)");
    if (found.crc != listed.crc)
      throw Error(path_ + ": checksum mismatch (the file is corrupt): " + kIndexName + " says " + crc_text(listed.crc) +
                  ", its bytes hash to " + crc_text(found.crc));
    file_ = std::make_unique<SafetensorsFile>(path_);
    header_ = verify_checkpoint_file(*file_, expected_model_hash, hint, built);
    auto says = [&](const char* key) {
      auto it = header_.metadata.find(key);
      return it == header_.metadata.end() ? std::string("nothing") : "'" + printable(it->second) + "'";
    };
    if (header_.step != index.step || header_.run != index.run ||
        says(kShardRankKey) != "'" + std::to_string(rank) + "'" ||
        says(kShardRanksKey) != "'" + std::to_string(index.ranks) + "'")
      throw Error(path_ + ": is not rank " + std::to_string(rank) + " of " + std::to_string(index.ranks) +
                  "'s shard of step " + std::to_string(index.step) + " of run " + printable(index.run) + " (it says step " +
                  std::to_string(header_.step) + ", run " + header_.run + ", shard " + says(kShardRankKey) + " of " +
                  says(kShardRanksKey) + ")");
    std::set<std::string> listed_here, held;
    for (const auto& [tensor, file] : index.weight_map)
      if (file == listed.name) listed_here.insert(tensor);
    for (const SafetensorsFile::Tensor& t : file_->tensors()) held.insert(t.name);
    if (held != listed_here)
      throw Error(path_ + ": holds other tensors than " + kIndexName + " lists for it (" + std::to_string(held.size()) +
                  " in the file, " + std::to_string(listed_here.size()) + " listed): the file or the index is not "
                  "this checkpoint's");
  }

  const SafetensorsFile& file() const { return *file_; }
  const CheckpointHeader& header() const { return header_; }

 private:
  std::string path_;
  std::unique_ptr<SafetensorsFile> file_;
  CheckpointHeader header_;
};

// Every file of `dir`, checked.
std::vector<std::unique_ptr<Shard>> open_all(const std::string& dir, const ShardedIndex& index,
                                             const std::string& expected_model_hash) {
  std::vector<std::unique_ptr<Shard>> shards;
  for (int r = 0; r < index.ranks; ++r) shards.push_back(std::make_unique<Shard>(dir, index, r, expected_model_hash, "", nullptr));
  return shards;
}

// The header a sharded checkpoint reads as: rank 0's, at the directory.
CheckpointHeader as_checkpoint(CheckpointHeader h, const std::string& dir) {
  h.path = dir;
  return h;
}

}  // namespace

std::string sharded_checkpoint_dirname(int64_t step) {
  if (step < 0) throw std::invalid_argument("sharded_checkpoint_dirname: negative step");
  char buf[64];
  std::snprintf(buf, sizeof buf, "step-%06" PRId64 ".sharded", step);
  return buf;
}

std::optional<int64_t> sharded_checkpoint_step(const std::string& name) {
  constexpr std::string_view suffix = ".sharded";
  if (!name.ends_with(suffix)) return std::nullopt;
  // checkpoint_step parses the same step-<digits> part of a file's name.
  return checkpoint_step(name.substr(0, name.size() - suffix.size()) + ".safetensors");
}

std::string shard_filename(int rank, int ranks) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank-%05d-of-%05d.safetensors", rank, ranks);
  return buf;
}

bool is_sharded_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return false;
  // Named so without its index (damaged by hand): read as one, so that the error names the missing index.
  return std::filesystem::exists(path + "/" + kIndexName, ec) ||
         sharded_checkpoint_step(std::filesystem::path(path).filename().string()).has_value();
}

std::string make_sharded_temporary(const std::string& dir, int64_t step) {
  std::string tmp = dir + "/.tmp-" + sharded_checkpoint_dirname(step) + "-XXXXXX";
  if (!::mkdtemp(tmp.data())) throw Error(tmp + ": cannot create the sharded checkpoint's temporary directory: " + std::strerror(errno));
  ::chmod(tmp.c_str(), 0755);  // mkdtemp makes it 0700; the checkpoint is read by every rank's user
  return tmp;
}

ShardFile write_shard(const std::string& temporary, int rank, int ranks, int64_t step,
                      const std::vector<TensorRef>& tensors, const std::string& model_hash, const std::string& run,
                      const std::map<std::string, std::string>& metadata) {
  // A test's window on a save in progress (tests/e2e/sharded_checkpoint_test.cpp kills a rank here): the
  // temporary exists, this rank's file does not yet.
  if (const char* pause = std::getenv("NAPKIN_TEST_PAUSE_IN_SHARD_WRITE"))
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(pause)));
  std::map<std::string, std::string> meta = metadata;
  meta[kShardRankKey] = std::to_string(rank);
  meta[kShardRanksKey] = std::to_string(ranks);
  const std::string path = temporary + "/" + shard_filename(rank, ranks);
  write_checkpoint_file(path, step, tensors, model_hash, run, meta);
  return measure(path);
}

void publish_sharded_checkpoint(const std::string& temporary, const std::string& final_path, const ShardedIndex& index) {
  nlohmann::ordered_json j;
  j["format"] = kIndexFormat;
  j["step"] = index.step;
  j["ranks"] = index.ranks;
  j["model_hash"] = index.model_hash;
  j["run"] = index.run;
  j["weight_map"] = nlohmann::ordered_json::object();
  for (const auto& [tensor, file] : index.weight_map) j["weight_map"][tensor] = file;
  j["files"] = nlohmann::ordered_json::object();
  for (const ShardFile& f : index.files) j["files"][f.name] = {{"bytes", f.bytes}, {"checksum", crc_text(f.crc)}};
  write_synced(temporary + "/" + kIndexName, j.dump(1) + "\n");
  fsync_directory(temporary);
  if (std::rename(temporary.c_str(), final_path.c_str()) != 0)
    throw Error(final_path + ": cannot rename the sharded checkpoint's temporary into place: " + std::strerror(errno));
  fsync_directory(std::filesystem::path(final_path).parent_path().string());
}

ShardedIndex read_sharded_index(const std::string& dir) {
  using Json = nlohmann::ordered_json;
  const std::string path = dir + "/" + kIndexName;
  Json j;
  {
    MappedFile file(path);
    try {
      j = Json::parse(file.data(), file.data() + file.size());
    } catch (const Json::parse_error& e) {
      throw bad_index(dir, std::string("not valid JSON: ") + e.what());
    }
    file.check_intact();
  }
  if (!j.is_object()) throw bad_index(dir, "not a JSON object");
  auto field = [&](const char* key, bool (Json::*is)() const noexcept, const char* kind) -> const Json& {
    if (!j.contains(key) || !(j.at(key).*is)()) throw bad_index(dir, std::string("no '") + key + "' " + kind);
    return j.at(key);
  };
  if (field("format", &Json::is_string, "string").get<std::string>() != kIndexFormat)
    throw bad_index(dir, "format '" + printable(j.at("format").get<std::string>()) + "' is not " + kIndexFormat);
  ShardedIndex index;
  const Json& step = field("step", &Json::is_number_unsigned, "step count");
  const Json& ranks = field("ranks", &Json::is_number_unsigned, "rank count");
  if (step.get<uint64_t>() > 1'000'000'000'000'000'000ull) throw bad_index(dir, "'step' is out of range");
  if (ranks.get<uint64_t>() < 1 || ranks.get<uint64_t>() > 1'000'000) throw bad_index(dir, "'ranks' is out of range");
  index.step = static_cast<int64_t>(step.get<uint64_t>());
  index.ranks = static_cast<int>(ranks.get<uint64_t>());
  index.model_hash = field("model_hash", &Json::is_string, "string").get<std::string>();
  index.run = field("run", &Json::is_string, "string").get<std::string>();
  const Json& files = field("files", &Json::is_object, "object");
  for (int r = 0; r < index.ranks; ++r) {
    ShardFile f;
    f.name = shard_filename(r, index.ranks);
    if (!files.contains(f.name)) throw bad_index(dir, "'files' does not list " + f.name);
    const Json& entry = files.at(f.name);
    const std::string checksum = entry.is_object() && entry.contains("checksum") && entry.at("checksum").is_string()
                                     ? entry.at("checksum").get<std::string>() : "";
    if (!entry.is_object() || !entry.contains("bytes") || !entry.at("bytes").is_number_unsigned() ||
        checksum.size() != 15 || !checksum.starts_with("crc32c:") ||
        checksum.find_first_not_of("0123456789abcdef", 7) != std::string::npos)
      throw bad_index(dir, "the entry of " + f.name + " is not {\"bytes\": N, \"checksum\": \"crc32c:xxxxxxxx\"}");
    f.bytes = static_cast<int64_t>(entry.at("bytes").get<uint64_t>());
    f.crc = static_cast<uint32_t>(std::stoul(checksum.substr(7), nullptr, 16));
    index.files.push_back(f);
  }
  if (files.size() != index.files.size()) throw bad_index(dir, "'files' lists other files than the ranks'");
  // An ordered_json: weight_map's order is the format's.
  for (const auto& [tensor, file] : field("weight_map", &Json::is_object, "object").items()) {
    if (!file.is_string() || !files.contains(file.get<std::string>()))
      throw bad_index(dir, "'weight_map' puts " + printable(tensor) + " in no file of the checkpoint");
    index.weight_map.emplace_back(tensor, file.get<std::string>());
  }
  return index;
}

CheckpointHeader read_sharded_header(const std::string& dir) {
  const ShardedIndex index = read_sharded_index(dir);
  CheckpointHeader h = read_checkpoint_file_header(dir + "/" + index.files.front().name);
  if (h.model_hash != index.model_hash || h.run != index.run || h.step != index.step)
    throw Error(h.path + ": is not the first shard of step " + std::to_string(index.step) + " of run " +
                printable(index.run) + " (it says step " + std::to_string(h.step) + ", run " + h.run + ")");
  return as_checkpoint(h, dir);
}

CheckpointHeader read_sharded_checkpoint(const std::string& dir, const std::vector<TensorRef>& into,
                                         const std::vector<std::string>& ignorable,
                                         const std::string* expected_model_hash, const std::string& hint,
                                         const StepBuild* built, std::vector<std::string>* ignored) {
  const ShardedIndex index = read_sharded_index(dir);
  const std::string hash = expected_model_hash ? *expected_model_hash : index.model_hash;
  // The files to open: rank 0's (the header), those holding a tensor of `into`, and those holding one that is
  // neither wanted nor ignorable (an Error lists it). A file of ignorable tensors only is not read.
  std::set<std::string> wanted, skip(ignorable.begin(), ignorable.end());
  for (const TensorRef& r : into) wanted.insert(r.name);
  std::set<std::string> needed = {index.files.front().name};
  std::vector<std::string> ignored_unread;
  for (const auto& [tensor, file] : index.weight_map)
    if (!skip.count(tensor)) needed.insert(file);
  for (const auto& [tensor, file] : index.weight_map)
    if (skip.count(tensor) && !needed.count(file)) ignored_unread.push_back(tensor);
  std::vector<std::unique_ptr<Shard>> shards;
  std::vector<const SafetensorsFile*> files;
  for (int r = 0; r < index.ranks; ++r) {
    if (!needed.count(index.files[static_cast<size_t>(r)].name)) continue;
    shards.push_back(std::make_unique<Shard>(dir, index, r, hash, hint, built));
    files.push_back(&shards.back()->file());
  }
  std::vector<std::string> found = load_checkpoint_tensors(dir, files, into, ignorable);
  if (ignored) {
    *ignored = found;
    ignored->insert(ignored->end(), ignored_unread.begin(), ignored_unread.end());
  }
  return as_checkpoint(shards.front()->header(), dir);
}

CheckpointHeader verify_sharded_checkpoint(const std::string& dir, const std::string& expected_model_hash) {
  const ShardedIndex index = read_sharded_index(dir);
  return as_checkpoint(open_all(dir, index, expected_model_hash).front()->header(), dir);
}

CheckpointHeader consolidate_sharded_checkpoint(const std::string& dir, const std::string& output) {
  const ShardedIndex index = read_sharded_index(dir);
  const std::vector<std::unique_ptr<Shard>> shards = open_all(dir, index, index.model_hash);
  std::map<std::string, const SafetensorsFile*> by_name;
  for (int r = 0; r < index.ranks; ++r) by_name[index.files[static_cast<size_t>(r)].name] = &shards[static_cast<size_t>(r)]->file();
  std::vector<TensorRef> tensors;
  for (const auto& [tensor, file] : index.weight_map) {
    const SafetensorsFile::Tensor* t = by_name.at(file)->find(tensor);
    tensors.push_back({t->name, t->dtype, t->shape, const_cast<char*>(t->data)});  // only read
  }
  const CheckpointHeader& first = shards.front()->header();
  std::map<std::string, std::string> metadata = first.metadata;
  for (const char* key : {"format", "model_hash", "run", "step", "checksum", kShardRankKey, kShardRanksKey})
    metadata.erase(key);
  write_checkpoint_file(output, index.step, tensors, index.model_hash, index.run, metadata);
  try {
    for (const std::unique_ptr<Shard>& s : shards) s->file().check_intact();  // shrunk under us: zeros were written
  } catch (const Error&) {
    ::unlink(output.c_str());
    throw;
  }
  return read_checkpoint_file_header(output);
}

}  // namespace napkin::runtime
