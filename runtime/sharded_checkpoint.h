// Sharded checkpoints: a run whose state lies on several ranks (ZeRO,
// docs/distributed.md) saves it without gathering it anywhere: each rank
// writes the tensors it owns, and the whole is one directory.
//
// Layout: DIR/step-000100.sharded/ (the step zero-padded as checkpoint.h's
// files) holding
//   rank-00000-of-00002.safetensors, ...  one per rank, each an ordinary napkin
//       checkpoint file (checkpoint.h: model hash, run, step, metadata,
//       checksum) of that rank's tensors, with "shard_rank" and "shard_ranks"
//       in its metadata
//   index.json  in the spirit of Hugging Face's model.safetensors.index.json:
//       {"format": "napkin-sharded-checkpoint-1", "step": 100, "ranks": 2,
//        "model_hash": "...", "run": "...",
//        "weight_map": {"wte": "rank-00000-of-00002.safetensors", ...},
//        "files": {"rank-00000-of-00002.safetensors":
//                  {"bytes": 123, "checksum": "crc32c:xxxxxxxx"}, ...}}
//       weight_map lists every tensor in the order a single-file checkpoint
//       of the same run holds them (consolidate writes that order); a file's
//       checksum is the CRC-32C of all its bytes.
//
// Writing, so that a crash of any rank at any point leaves every earlier
// checkpoint as it was and at most a temporary (which the next run's start
// removes, checkpoint_dir.h): rank 0 makes DIR/.tmp-step-000100.sharded-XXXXXX
// and tells the others its name; each rank writes its file into it (synced);
// once every rank has, rank 0 writes index.json (synced), syncs the
// temporary, renames it to its final name and syncs DIR. A directory named
// step-N.sharded is thus always complete.
//
// Reading checks index.json, then every file it opens against the index
// (size, CRC-32C, its own header and checksum, the same step and run, the
// tensors the index lists for it): a missing or damaged shard is an Error
// naming it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/checkpoint_file.h"

namespace napkin::runtime {

// "step-000100.sharded".
std::string sharded_checkpoint_dirname(int64_t step);
// The step of a directory named step-<digits>.sharded, else nullopt.
std::optional<int64_t> sharded_checkpoint_step(const std::string& name);
// "rank-00000-of-00002.safetensors".
std::string shard_filename(int rank, int ranks);
// Whether `path` is a sharded checkpoint: a directory holding index.json, or
// one named step-N.sharded (whose index is then missing, an Error on read).
bool is_sharded_checkpoint(const std::string& path);

struct ShardFile {
  std::string name;  // shard_filename
  int64_t bytes = 0;
  uint32_t crc = 0;  // CRC-32C of the whole file
};

struct ShardedIndex {
  int64_t step = 0;
  int ranks = 0;
  std::string model_hash, run;
  // Every tensor -> the file holding it, in a single-file checkpoint's order.
  std::vector<std::pair<std::string, std::string>> weight_map;
  std::vector<ShardFile> files;  // by rank
};

// Rank 0, first: the temporary DIR/.tmp-step-000100.sharded-XXXXXX (DIR must
// exist).
std::string make_sharded_temporary(const std::string& dir, int64_t step);
// Every rank, into the temporary: its file (write_checkpoint_file, with the
// shard's rank in its metadata), synced; returns its size and CRC for the
// index.
ShardFile write_shard(const std::string& temporary, int rank, int ranks, int64_t step,
                      const std::vector<TensorRef>& tensors, const std::string& model_hash, const std::string& run,
                      const std::map<std::string, std::string>& metadata);
// Rank 0, once every shard is written: index.json, then the temporary renamed
// to `final_path`, as above.
void publish_sharded_checkpoint(const std::string& temporary, const std::string& final_path, const ShardedIndex& index);

// index.json of the sharded checkpoint `dir`, validated (an Error names what
// is wrong; nothing else is read).
ShardedIndex read_sharded_index(const std::string& dir);

// The header of rank 0's file (the run's metadata: seed, micro-batches per
// step), its path `dir`; checked against the index. Cheap: the tensors and
// checksums are not read.
CheckpointHeader read_sharded_header(const std::string& dir);

// Loads `into` from the files of `dir` that hold them (each checked as
// above; rank 0's always, for the header), with load_checkpoint_tensors'
// rules: exactly the tensors of `into` apart from `ignorable` ones.
// `expected_model_hash` null: any model's (--init). `ignored`, if given,
// receives the names of the ignorable tensors the checkpoint holds.
CheckpointHeader read_sharded_checkpoint(const std::string& dir, const std::vector<TensorRef>& into,
                                         const std::vector<std::string>& ignorable,
                                         const std::string* expected_model_hash, const std::string& hint = "",
                                         const StepBuild* built = nullptr, std::vector<std::string>* ignored = nullptr);

// Checks every file of `dir` as above, and the model hash.
CheckpointHeader verify_sharded_checkpoint(const std::string& dir, const std::string& expected_model_hash);

// `napkin checkpoint consolidate`: every file of `dir` checked, then the
// single-file checkpoint of the same state written atomically to `output`:
// the tensors in weight_map's order with the run's metadata, byte for byte
// the file the single format writes (so --init, --resume, napkin sample and
// the Hugging Face export read it). Returns its header.
CheckpointHeader consolidate_sharded_checkpoint(const std::string& dir, const std::string& output);

}  // namespace napkin::runtime
