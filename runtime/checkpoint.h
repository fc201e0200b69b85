// Checkpoints: everything a trainer needs to resume bit for bit, in ONE
// safetensors file, written atomically so a crash or a full disk never leaves a
// half-written file where the newest checkpoint should be.
//
// File: DIR/step-000100.safetensors (the step zero-padded to at least 6
// digits). Tensors: every parameter under its model name ("wte",
// "blocks.0.w_qkv") and every optimizer state tensor ("adam.m.wte",
// "optimizer.step"), in the order given. __metadata__: the caller's strings
// (model name, seed, ...) plus
//   format      "napkin-checkpoint-1"
//   model_hash  the trainer's hash of its model; a checkpoint only loads into
//               the model that wrote it
//   step        the step count, decimal (the data loader's position: its
//               batches are a pure function of (seed, step), see dataset.h)
//   checksum    "crc32c:xxxxxxxx", CRC-32C (Castagnoli) of the data section,
//               so corruption is detected on load
//
// Writing: DIR/.tmp-step-000100.safetensors-XXXXXX in the same directory,
// fsync, rename onto the final name, fsync the directory; only then are
// checkpoints beyond the newest `keep` deleted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace napkin::runtime {

// A tensor in the trainer's arena: read from when saving, written when loading.
struct TensorRef {
  std::string name;
  std::string dtype;            // napkin's name: "f32", "bf16", "i64", ...
  std::vector<int64_t> shape;
  void* data;
};

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, as in iSCSI and
// ext4), chainable: crc32c(b, n2, crc32c(a, n1)) == crc32c(a ++ b).
// crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);

// "step-000100.safetensors".
std::string checkpoint_filename(int64_t step);

// Writes the checkpoint of `step` into `dir` (created if missing) and returns
// its path, then deletes all but the newest `keep` checkpoints (keep <= 0:
// none deleted). `metadata` must not use the reserved keys above. On failure
// the temp file is removed and every earlier checkpoint is left as it was.
std::string write_checkpoint(const std::string& dir, int64_t step, const std::vector<TensorRef>& tensors,
                             const std::string& model_hash, const std::map<std::string, std::string>& metadata,
                             int keep);

// The checkpoint in `dir` with the highest step (files named step-N.safetensors;
// temp files and anything else ignored), or nullopt if there is none or no dir.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// Loads a checkpoint into `into`: checks the format, the checksum, the model
// hash, then that the file holds exactly the tensors of `into` with their
// dtypes and shapes (every problem listed in one Error), and only then copies.
// Returns the metadata (including "step").
std::map<std::string, std::string> read_checkpoint(const std::string& path, const std::vector<TensorRef>& into,
                                                   const std::string& expected_model_hash);

// --init FILE.safetensors: loads weights from any safetensors file (from
// napkin or from PyTorch): every param must be present with its dtype and
// shape, and the file must hold nothing else. A checksum in the metadata is
// verified; none is required.
void read_weights(const std::string& path, const std::vector<TensorRef>& params);

}  // namespace napkin::runtime
