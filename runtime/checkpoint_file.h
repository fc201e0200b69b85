// Checkpoint files: everything a trainer needs to resume bit for bit, in ONE
// safetensors file, written atomically so a crash or a full disk never leaves
// a half-written file where a checkpoint should be (a sharded checkpoint is a
// directory of such files, sharded_checkpoint.h; checkpoint.h reads either). What a run may do to a
// directory of checkpoints (lock, prune, refuse another run's files) is
// checkpoint_dir.h's business; this file is the format.
//
// File: DIR/step-000100.safetensors (the step zero-padded to at least 6
// digits). Tensors: every parameter under its model name ("wte",
// "blocks.0.w_qkv") and every optimizer state tensor ("adam.m.wte",
// "optimizer.step"), in the order given. __metadata__: the caller's strings
// (model name, seed, ...) plus
//   format      "napkin-checkpoint-2" (version 1 files are still read)
//   model_hash  the trainer's hash of its model; a checkpoint only loads into
//               the model that wrote it
//   run         the run that wrote it, 16 hex digits (a resumed run keeps the
//               id of the run it resumed): a run prunes only its own files
//   step        the step count, decimal, 0 to 10^18 (the data loader's
//               position: its batches are a pure function of (seed, step))
//   checksum    "crc32c:xxxxxxxx", CRC-32C (Castagnoli) of the header's
//               content followed by the data section, so a flipped byte
//               anywhere, a metadata value edited by hand or two tensors'
//               offsets swapped is detected on load. The header's content,
//               as hashed: every metadata entry but the checksum in key
//               order, then every tensor in data order as (name, dtype,
//               shape), each string preceded by its length as 8 bytes
//               little-endian. (Version 1 hashed the data section only.)
//
// Every metadata field the trainer uses is validated on load (step and seed
// are whole numbers in range, the run id is hex), so a hand-edited file is a
// clear Error, never a crash.
//
// Writing: DIR/.tmp-step-000100.safetensors-XXXXXX in the same directory,
// fsync, rename onto the final name, fsync the directory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace napkin::runtime {

class SafetensorsFile;

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

// Whether `file` is a napkin checkpoint: its format metadata says so.
bool is_napkin_checkpoint(const SafetensorsFile& file);

// "step-000100.safetensors".
std::string checkpoint_filename(int64_t step);
// The step of a file named step-<digits>.safetensors, else nullopt.
std::optional<int64_t> checkpoint_step(const std::string& filename);

// The validated metadata of a checkpoint.
// How a trainer's step was built (ir/training_config.h), which its checkpoints
// record under these keys: when a checkpoint's model hash is not the
// program's, a difference here is the likely reason, and the message names it.
struct StepBuild {
  std::string dims;           // --dims, "" for the model file's own
  int64_t memory_budget = 0;  // --memory-budget in bytes, 0 for none
};
inline constexpr const char* kDimsKey = "dims";
inline constexpr const char* kMemoryBudgetKey = "memory_budget";
// The metadata entries that record `build`.
std::map<std::string, std::string> build_metadata(const StepBuild& build);

struct CheckpointHeader {
  std::string path;
  int format = 0;                 // 1 or 2
  std::string model_hash;
  std::string run;                // "" in version 1 files
  int64_t step = 0;
  std::optional<uint64_t> seed;   // the trainer's "seed", when present
  std::map<std::string, std::string> metadata;  // everything, as stored
};

// Writes the checkpoint of `step` atomically into `dir` (created if missing)
// and returns its path. `metadata` must not use the reserved keys above. On
// failure the temp file is removed and every earlier file is left as it was.
std::string write_checkpoint(const std::string& dir, int64_t step, const std::vector<TensorRef>& tensors,
                             const std::string& model_hash, const std::string& run,
                             const std::map<std::string, std::string>& metadata);

// The same into the file `path` (atomically, as above), whatever its name:
// a sharded checkpoint's files are written so.
void write_checkpoint_file(const std::string& path, int64_t step, const std::vector<TensorRef>& tensors,
                           const std::string& model_hash, const std::string& run,
                           const std::map<std::string, std::string>& metadata);

// Reads and validates a file's header only (format and fields, not the
// checksum or the tensors): cheap enough to call on every file of a
// directory.
CheckpointHeader read_checkpoint_file_header(const std::string& path);

// Checks format, fields, checksum and model hash of a file already open
// (`hint`, if any, ends the message when another model wrote it; `built`
// names the settings that differ).
CheckpointHeader verify_checkpoint_file(const SafetensorsFile& file, const std::string& expected_model_hash,
                                        const std::string& hint = "", const StepBuild* built = nullptr);

// A safetensors file's checksum: a napkin checkpoint's by its format, another
// program's when its metadata has one. Error if it does not match.
void verify_safetensors_checksum(const SafetensorsFile& file);

// Checks that `files` together hold exactly the tensors of `refs` (names,
// dtypes, shapes) apart from the `ignorable` ones, listing every difference
// in one Error that begins with `source`, then copies them in. Returns the
// names of the ignored tensors found.
std::vector<std::string> load_checkpoint_tensors(const std::string& source, const std::vector<const SafetensorsFile*>& files,
                                                 const std::vector<TensorRef>& refs,
                                                 const std::vector<std::string>& ignorable);

// Model text for a message: control bytes as \xNN, cut to `max_chars`.
std::string printable(const std::string& text, size_t max_chars = 80);

}  // namespace napkin::runtime
