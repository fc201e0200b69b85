// Hugging Face's safetensors format, which napkin's checkpoints and --init
// weight files use, so they load in PyTorch (safetensors.torch.load_file) and
// back. The layout (https://github.com/huggingface/safetensors):
//   8 bytes   N, the header length, u64 little-endian
//   N bytes   JSON: {"__metadata__": {str: str},
//                    "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//             padded with spaces to a multiple of 8 bytes
//   the data  every tensor's bytes, row-major little-endian, at [begin, end)
//             relative to the end of the header, in order, without gaps
// The API speaks napkin's dtype names ("f32"); the file holds safetensors'
// ("F32"). See kDtypes in safetensors.cpp for the pairs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/mapped_file.h"

namespace napkin::runtime {

// Bytes per element of a napkin dtype safetensors can hold (f64 f32 f16 bf16
// f8e4m3 f8e5m2 i64 i32 i16 i8 u64 u32 u16 u8 bool), or nullopt.
std::optional<size_t> safetensors_itemsize(std::string_view dtype);

// "f32[64, 32]", for messages.
std::string tensor_type_text(std::string_view dtype, const std::vector<int64_t>& shape);

struct TensorData {
  std::string name;
  std::string dtype;             // napkin's name
  std::vector<int64_t> shape;    // [] for a scalar (one element)
  const void* data;              // numel * itemsize bytes
};

// Writes a whole safetensors file to `fd`: the header (metadata first, then
// the tensors in the given order) and the data, tensors in the same order.
// `path` only names the file in errors. Throws Error on a write failure, and
// std::invalid_argument for an unknown dtype or a duplicate name (caller bugs).
void write_safetensors(int fd, const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata);

// The same, into a new file at `path` (not atomic: checkpoints go through
// write_checkpoint, which is).
void write_safetensors_file(const std::string& path, const std::vector<TensorData>& tensors,
                            const std::map<std::string, std::string>& metadata);

// The same, atomically: into DIR/.tmp-NAME-XXXXXX beside `path`, synced to
// disk, renamed onto `path`, the directory synced; a crash or a full disk
// leaves the file that was there or the new one, never part of one, and no
// temporary on an Error. Checkpoints and napkin hf's files are written so.
void write_safetensors_file_atomically(const std::string& path, const std::vector<TensorData>& tensors,
                                       const std::map<std::string, std::string>& metadata);

// All `bytes` at `data` to `fd` (EINTR retried); Error naming `path` if not.
void write_all(int fd, const std::string& path, const void* data, size_t bytes);

// Syncs the directory `dir` itself to disk, so that a rename or a new name in
// it survives a crash; Error if it cannot.
void fsync_directory(const std::string& dir);

// A safetensors file, mapped and fully validated on construction: the header
// length lies within the file, the header is JSON of the shape above, every
// dtype is known, every tensor's byte range matches numel * itemsize, the
// ranges tile the data section exactly (no gaps, overlaps, missing or trailing
// bytes). Each failure is an Error naming the file and the problem.
class SafetensorsFile {
 public:
  struct Tensor {
    std::string name;
    std::string dtype;            // napkin's name
    std::vector<int64_t> shape;
    const char* data;             // inside the mapping
    size_t bytes;
  };

  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // In data order (by begin offset).
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor* find(std::string_view name) const;
  // Everything after the header: the bytes a checksum covers.
  // Error if the file shrank since it was mapped (mapped_file.h): call after
  // copying tensors out, whose vanished pages read as zeros.
  void check_intact() const { file_.check_intact(); }
  const char* data_section() const { return data_; }
  size_t data_size() const { return data_size_; }

 private:
  MappedFile file_;
  std::map<std::string, std::string> metadata_;
  std::vector<Tensor> tensors_;
  const char* data_ = nullptr;
  size_t data_size_ = 0;
};

}  // namespace napkin::runtime
