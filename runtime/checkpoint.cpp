#include "runtime/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace napkin::runtime {

namespace {

// A file of a sharded checkpoint read as one: its tensors are a part of the
// run's, so an Error says where the whole is.
void refuse_lone_shard(const SafetensorsFile& file) {
  if (file.metadata().count("shard_ranks"))
    throw Error(file.path() + ": is one rank's file of a sharded checkpoint, a part of the run's state: read its "
                "directory (" + std::filesystem::path(file.path()).parent_path().string() +
                "), or make one file of it with `napkin checkpoint consolidate`");
}

}  // namespace

bool is_checkpoint_temporary(const std::string& filename) {
  // ".tmp-" + checkpoint_filename(step) + "-XXXXXX", as write_checkpoint makes them, or the same of
  // sharded_checkpoint_dirname(step), as make_sharded_temporary does.
  if (!filename.starts_with(".tmp-")) return false;
  const size_t dash = filename.rfind('-');
  if (dash == std::string::npos || dash <= 5 || filename.size() - dash - 1 != 6) return false;
  const std::string name = filename.substr(5, dash - 5);
  return checkpoint_step(name).has_value() || sharded_checkpoint_step(name).has_value();
}

CheckpointHeader read_checkpoint_header(const std::string& path) {
  if (is_sharded_checkpoint(path)) return read_sharded_header(path);
  return read_checkpoint_file_header(path);
}

CheckpointHeader verify_checkpoint(const std::string& path, const std::string& expected_model_hash) {
  if (is_sharded_checkpoint(path)) return verify_sharded_checkpoint(path, expected_model_hash);
  return verify_checkpoint_file(SafetensorsFile(path), expected_model_hash);
}

CheckpointHeader read_checkpoint(const std::string& path, const std::vector<TensorRef>& into,
                                 const std::string& expected_model_hash, const std::string& hint,
                                 const StepBuild* built, const std::vector<std::string>& not_loaded) {
  if (is_sharded_checkpoint(path))
    return read_sharded_checkpoint(path, into, not_loaded, &expected_model_hash, hint, built);
  SafetensorsFile file(path);
  refuse_lone_shard(file);
  CheckpointHeader h = verify_checkpoint_file(file, expected_model_hash, hint, built);
  load_checkpoint_tensors(path, {&file}, into, not_loaded);
  return h;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return found;
  if (ec) throw Error(dir + ": cannot list checkpoints: " + ec.message());
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    if (auto step = checkpoint_step(name); step && entry.is_regular_file(ec)) found.emplace_back(*step, entry.path().string());
    if (auto step = sharded_checkpoint_step(name); step && entry.is_directory(ec))
      found.emplace_back(*step, entry.path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  for (size_t i = 1; i < found.size(); ++i)
    if (found[i].first == found[i - 1].first)
      throw Error(dir + ": step " + std::to_string(found[i].first) + " is saved both as " + found[i].second + " and as " +
                  found[i - 1].second + ": which is the run's is ambiguous; move one of them away");
  return found;
}

std::vector<std::string> older_usable_checkpoints(const std::vector<std::pair<int64_t, std::string>>& all,
                                                  const std::string& expected_model_hash) {
  std::vector<std::string> good;
  for (size_t i = 1; i < all.size(); ++i) {
    try {
      verify_checkpoint(all[i].second, expected_model_hash);
      good.push_back(all[i].second);
    } catch (const Error&) {
    }
  }
  return good;
}

std::vector<std::string> read_weights(const std::string& path, const std::vector<TensorRef>& params,
                                      const std::vector<std::string>& ignorable) {
  if (is_sharded_checkpoint(path)) {
    std::vector<std::string> ignored;
    read_sharded_checkpoint(path, params, ignorable, nullptr, "", nullptr, &ignored);
    return ignored;
  }
  SafetensorsFile file(path);
  refuse_lone_shard(file);
  verify_safetensors_checksum(file);
  return load_checkpoint_tensors(path, {&file}, params, ignorable);
}

std::optional<CheckpointHeader> read_model_weights(const std::string& path, const std::vector<TensorRef>& params,
                                                   const std::string& expected_model_hash, const std::string& hint,
                                 const StepBuild* built) {
  if (is_sharded_checkpoint(path)) {
    std::set<std::string> wanted;
    for (const TensorRef& r : params) wanted.insert(r.name);
    std::vector<std::string> others;  // the optimizer state
    for (const auto& [tensor, file] : read_sharded_index(path).weight_map)
      if (!wanted.count(tensor)) others.push_back(tensor);
    return read_sharded_checkpoint(path, params, others, &expected_model_hash, hint, built);
  }
  SafetensorsFile file(path);
  refuse_lone_shard(file);
  if (!is_napkin_checkpoint(file)) {
    verify_safetensors_checksum(file);
    load_checkpoint_tensors(path, {&file}, params, {});
    return std::nullopt;
  }
  CheckpointHeader h = verify_checkpoint_file(file, expected_model_hash, hint, built);
  std::set<std::string> wanted;
  for (const TensorRef& r : params) wanted.insert(r.name);
  std::vector<std::string> others;  // the optimizer state
  for (const SafetensorsFile::Tensor& t : file.tensors())
    if (!wanted.count(t.name)) others.push_back(t.name);
  load_checkpoint_tensors(path, {&file}, params, others);
  return h;
}

}  // namespace napkin::runtime
