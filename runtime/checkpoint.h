// Checkpoints, whichever their layout: one file (checkpoint_file.h) or a
// sharded checkpoint's directory of one file per rank
// (sharded_checkpoint.h). What the trainer, the sampler and the tools read
// and look for; each reader takes either kind of path, a directory holding
// index.json being a sharded checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/checkpoint_file.h"
#include "runtime/sharded_checkpoint.h"

namespace napkin::runtime {

// Temporaries of interrupted saves: ".tmp-step-000100.safetensors-XXXXXX",
// and the directories ".tmp-step-000100.sharded-XXXXXX".
bool is_checkpoint_temporary(const std::string& filename);

// Reads and validates the header only (format and fields, not the checksum or
// the tensors; of a sharded checkpoint rank 0's file, at the directory's
// path): cheap enough to call on every checkpoint of a directory.
CheckpointHeader read_checkpoint_header(const std::string& path);

// Checks format, fields, checksum and model hash without copying anything
// (every file of a sharded checkpoint).
CheckpointHeader verify_checkpoint(const std::string& path, const std::string& expected_model_hash);

// Loads a checkpoint into `into`: verify_checkpoint, then checks that the file
// holds exactly the tensors of `into` with their dtypes and shapes (every
// problem listed in one Error), and only then copies. `hint`, if any, ends
// the message when another model wrote the file. `not_loaded`: tensors of
// the run this process does not hold (a ZeRO rank's others' optimizer
// state), skipped where the checkpoint has them; a sharded checkpoint's
// files that hold nothing else are not read.
CheckpointHeader read_checkpoint(const std::string& path, const std::vector<TensorRef>& into,
                                 const std::string& expected_model_hash, const std::string& hint = "",
                                 const StepBuild* built = nullptr, const std::vector<std::string>& not_loaded = {});

// (step, path) of every checkpoint in `dir`, step-N.safetensors files and
// step-N.sharded directories, newest first; empty if there is no such
// directory. Temporaries and other files are ignored. A step saved both ways
// is an Error (which of the two is the run's is anyone's guess).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

// The files of `all` (list_checkpoints' order) after the newest that
// verify_checkpoint accepts for `expected_model_hash`, newest first: what a
// run can go on from when the newest checkpoint of a directory cannot be used.
std::vector<std::string> older_usable_checkpoints(const std::vector<std::pair<int64_t, std::string>>& all,
                                                  const std::string& expected_model_hash);

// --init FILE.safetensors: loads weights from any safetensors file (from
// napkin or from PyTorch): every param must be present with its dtype and
// shape. Tensors named in `ignorable` (a full checkpoint's optimizer state)
// are skipped; anything else extra is an Error. A checksum in a napkin
// checkpoint is verified. Returns the names of the tensors skipped.
std::vector<std::string> read_weights(const std::string& path, const std::vector<TensorRef>& params,
                                      const std::vector<std::string>& ignorable = {});

// A model's weights without its optimizer (napkin sample): every tensor of
// `params` from `path`, loaded once. A napkin checkpoint must be one of the
// model `expected_model_hash` (verify_checkpoint's checks; `hint` ends the
// message when it is another model's) and its other tensors, the optimizer
// state, are skipped; returns its header. Another safetensors file must hold
// exactly `params` (its checksum checked when it has one); returns nullopt.
std::optional<CheckpointHeader> read_model_weights(const std::string& path, const std::vector<TensorRef>& params,
                                                   const std::string& expected_model_hash, const std::string& hint = "",
                                 const StepBuild* built = nullptr);

}  // namespace napkin::runtime
