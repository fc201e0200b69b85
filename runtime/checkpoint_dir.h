// What a training run may do to its checkpoint directory. The guarantees
// (docs/runtime.md, "Checkpoints", states them for users):
//
// - One run per directory at a time: DIR/.lock is held with flock(2) for the
//   whole run, so a second trainer pointed at DIR stops at start-up. The kernel
//   drops the lock when the process ends, however it ends (kill -9 included),
//   so a stale lock never blocks the next run. DIR/.lock is never followed
//   through a symbolic link, and one that is not a regular file of this user's
//   (with no other hard link) stops the run at start-up, untouched.
// - A directory is checked at start-up, not at the first save: it is created,
//   locked, and a probe file is written and removed, so an unwritable DIR is
//   an Error before step 1.
// - Anything named like a checkpoint that is not a regular file (a
//   directory step-000100.safetensors) stops the run at start-up, named:
//   the save of that step would fail on it.
// - Temporaries that killed saves left (.tmp-step-*.safetensors-XXXXXX, and
//   the directories .tmp-step-*.sharded-XXXXXX of sharded saves) are removed
//   at start-up, under the lock, so no other writer can own them.
// - Sharded checkpoints (step-N.sharded directories, sharded_checkpoint.h)
//   follow the same rules as files: lineage, pruning, the abandoned branch.
//   A step saved both as a file and as a directory is refused at start-up as
//   ambiguous, and a save never makes one.
// - A run writes only into a directory that is empty or holds checkpoints of
//   its own lineage: the same model (model_hash) and the same run id (a
//   resumed run carries on the id of the run it resumed). Anything else,
//   another model's files, another run's, or a file that cannot be read as a
//   checkpoint, stops the run at start-up with the list and the ways out.
// - A run resumed from an older checkpoint of its lineage while newer ones sit
//   in the directory (an abandoned branch) is refused too: pruning or
//   overwriting those would lose the newer history, keeping them would mix two.
// - Pruning (--keep N) deletes only checkpoints of this lineage at or before
//   the step just saved, oldest first, and only after the new one is safely on
//   disk; a file in the way of a save that is not this lineage's is never
//   overwritten.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/checkpoint.h"
#include "runtime/sharded_checkpoint.h"

namespace napkin::runtime {

// 16 hex digits from the kernel's random source: a fresh run's id.
std::string new_run_id();

// Which checkpoints are a run's own.
struct Lineage {
  std::string model_hash;
  std::string run;                // this run's id
  // A resumed run: the step it resumed from. Files of its lineage past that
  // step belong to the branch it abandoned; a directory holding them is
  // refused, since saving beside them would mix two histories.
  int64_t resumed_step = -1;
  // Resumed from a version-1 checkpoint (no run ids then): version-1 files of
  // the same model count as this lineage's.
  bool adopts_version1 = false;
};

class CheckpointDir {
 public:
  // Takes `dir` for the run as described above; Error if it cannot.
  CheckpointDir(std::string dir, Lineage lineage);
  ~CheckpointDir();
  CheckpointDir(const CheckpointDir&) = delete;
  CheckpointDir& operator=(const CheckpointDir&) = delete;

  const std::string& path() const { return dir_; }
  // Temporaries of killed saves removed at start-up.
  int temporaries_removed() const { return temporaries_removed_; }

  // Writes the checkpoint of `step` (write_checkpoint), then deletes this
  // lineage's checkpoints beyond the newest `keep` (keep <= 0: none).
  // Returns the new file's path.
  std::string save(int64_t step, const std::vector<TensorRef>& tensors,
                   const std::map<std::string, std::string>& metadata, int64_t keep);

  // A sharded save (rank 0's part, sharded_checkpoint.h): the temporary the
  // ranks write their files into, once the step's name is checked free ...
  std::string begin_sharded_save(int64_t step);
  // ... then, every file written, its index and its final name; prunes as
  // save() does. Returns the checkpoint's path. `index` names this lineage.
  std::string finish_sharded_save(const std::string& temporary, const ShardedIndex& index, int64_t keep);

 private:
  // The start-up work after the lock is taken: probe, clean, check lineage.
  void check_and_clean();
  // Empty when `path` is a checkpoint of this lineage, else why it is not.
  std::string foreign_reason(const std::string& path) const;
  // Error unless the step's checkpoint, as `path`, may be written: nothing
  // there, or a file of this lineage (replaced); and the step not saved the
  // other way.
  void check_target(int64_t step, const std::string& path) const;
  // This lineage's checkpoints at or before `step` beyond the newest `keep`.
  void prune(int64_t step, int64_t keep) const;

  std::string dir_;
  Lineage lineage_;
  int lock_fd_ = -1;
  int temporaries_removed_ = 0;
};

}  // namespace napkin::runtime
