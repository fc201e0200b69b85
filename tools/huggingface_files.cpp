#include "tools/huggingface_files.h"

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/error.h"
#include "tools/files.h"

namespace napkin::tools {

namespace fs = std::filesystem;
using runtime::Error;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

}  // namespace

void throw_problems(const std::string& head, const std::vector<std::string>& problems) {
  std::string message = fmt::format("{} ({} problem{})", head, problems.size(), problems.size() == 1 ? "" : "s");
  for (const std::string& p : problems) message += "\n  " + p;
  throw Error(message);
}

HfCheckpoint::HfCheckpoint(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found)
    throw Error(fmt::format("{}: no such file or directory", path));
  if (ec) throw Error(fmt::format("{}: {}", path, ec.message()));
  if (fs::is_directory(status)) {
    const fs::path dir(path);
    // As transformers' from_pretrained: the single file first.
    if (fs::exists(dir / kSingleFile, ec)) {
      add_file((dir / kSingleFile).string());
    } else if (fs::exists(dir / kIndexFile, ec)) {
      open_index((dir / kIndexFile).string());
    } else {
      const bool pickle = fs::exists(dir / "pytorch_model.bin", ec) || fs::exists(dir / "pytorch_model.bin.index.json", ec);
      throw Error(fmt::format(
          "{}: holds neither {} nor {}{}", path, kSingleFile, kIndexFile,
          pickle ? ": its pytorch_model.bin is a pickle, which napkin does not read; save the model with "
                   "save_pretrained(DIR, safe_serialization=True), transformers' default since 4.35"
                 : ""));
    }
  } else if (path.ends_with(".json")) {
    open_index(path);
  } else {
    add_file(path);
  }
}

void HfCheckpoint::add_file(const std::string& path) {
  if (std::string problem = input_problem(path); !problem.empty()) throw Error(problem);
  files_.push_back(std::make_unique<runtime::SafetensorsFile>(path));
  for (const Tensor& t : files_.back()->tensors()) {
    tensors_.push_back(&t);
    by_name_.emplace(t.name, &t);
  }
}

void HfCheckpoint::open_index(const std::string& index_path) {
  if (std::string problem = input_problem(index_path); !problem.empty()) throw Error(problem);
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_file_bytes(index_path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not a JSON index of shards: {}", index_path, e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object() ||
      index["weight_map"].empty())
    throw Error(fmt::format("{}: has no weight_map, the object of tensor name -> shard file an index holds", index_path));
  // Shards in the order the index first names them.
  std::vector<std::string> shards;
  std::map<std::string, std::string> shard_of;
  std::vector<std::string> problems;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) {
      problems.push_back(fmt::format("{}: its shard is {}, not a file name", name, shard.dump()));
      continue;
    }
    const std::string file = shard.get<std::string>();
    const fs::path relative(file);
    bool outside = file.empty() || relative.is_absolute();
    for (const fs::path& part : relative) outside = outside || part == "..";
    if (outside) {
      problems.push_back(fmt::format("{}: its shard '{}' is not a file in the index's directory", name, file));
      continue;
    }
    shard_of[name] = file;
    if (std::find(shards.begin(), shards.end(), file) == shards.end()) shards.push_back(file);
  }
  if (!problems.empty()) throw_problems(index_path + ": a bad weight_map", problems);
  const fs::path dir = fs::path(index_path).parent_path();
  for (const std::string& shard : shards) {
    const std::string path = (dir / shard).string();
    if (std::string problem = input_problem(path); !problem.empty()) throw Error(index_path + ": " + problem);
    files_.push_back(std::make_unique<runtime::SafetensorsFile>(path));
    for (const Tensor& t : files_.back()->tensors()) {
      tensors_.push_back(&t);
      auto listed = shard_of.find(t.name);
      if (listed == shard_of.end())
        problems.push_back(fmt::format("{} holds {}, which the index does not list", shard, t.name));
      else if (listed->second != shard)
        problems.push_back(fmt::format("{} holds {}, which the index puts in {}", shard, t.name, listed->second));
      else if (!by_name_.emplace(t.name, &t).second)
        problems.push_back(fmt::format("{} holds {} twice", shard, t.name));
    }
  }
  for (const auto& [name, shard] : shard_of)
    if (!by_name_.count(name)) problems.push_back(fmt::format("{} is not in {}, where the index puts it", name, shard));
  if (!problems.empty()) throw_problems(index_path + ": the index and its shards disagree", problems);
}

const HfCheckpoint::Tensor* HfCheckpoint::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<std::string> HfCheckpoint::paths() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f->path());
  return out;
}

void HfCheckpoint::check_intact() const {
  for (const auto& f : files_) f->check_intact();
}

}  // namespace napkin::tools
