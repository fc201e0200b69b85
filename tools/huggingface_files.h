// A transformers checkpoint on disk, as save_pretrained writes it: a directory
// with model.safetensors, or else with model.safetensors.index.json and the
// shards its weight_map names (from_pretrained's order); or one .safetensors
// file (or an index file) given by path. Every tensor of every file, by name.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/safetensors.h"

namespace napkin::tools {

// Throws runtime::Error "HEAD (N problems)" with the problems below it, one a
// line: napkin hf lists every mismatch at once.
[[noreturn]] void throw_problems(const std::string& head, const std::vector<std::string>& problems);

class HfCheckpoint {
 public:
  using Tensor = runtime::SafetensorsFile::Tensor;

  // Opens and validates every file (runtime::SafetensorsFile's checks). A
  // sharded checkpoint's index must be JSON with a weight_map of tensor name
  // -> shard file in the index's directory, each tensor in the shard it
  // names, each shard's tensors in the weight_map, no name in two shards.
  // Throws runtime::Error naming the path and listing every problem.
  explicit HfCheckpoint(const std::string& path);

  // Every tensor, file by file (the index's order of first mention), each in data order.
  const std::vector<const Tensor*>& tensors() const { return tensors_; }
  const Tensor* find(const std::string& name) const;
  // The safetensors files read.
  std::vector<std::string> paths() const;
  // runtime::SafetensorsFile::check_intact of every file: call after copying tensors out.
  void check_intact() const;

 private:
  std::vector<std::unique_ptr<runtime::SafetensorsFile>> files_;
  std::vector<const Tensor*> tensors_;
  std::map<std::string, const Tensor*> by_name_;
  // Opens the shards a model.safetensors.index.json names.
  void open_index(const std::string& index_path);
  void add_file(const std::string& path);
};

}  // namespace napkin::tools
