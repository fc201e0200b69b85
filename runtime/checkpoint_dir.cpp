#include "runtime/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <utility>

#include "runtime/error.h"

namespace napkin::runtime {

namespace {

constexpr const char* kLockName = ".lock";

// "step-000002.safetensors, step-000004.safetensors and 3 more".
std::string some_names(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 4; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > 4) s += " and " + std::to_string(names.size() - 4) + " more";
  return s;
}

// The start-up checks' message when the directory refuses a file.
Error unwritable(const std::string& dir, int err) {
  return Error(dir + ": cannot write checkpoints here: " + std::strerror(err) +
               " (checked at start-up; pick another --checkpoint-dir)");
}

// DIR/.lock, opened (created if absent) for the lock and the holder's pid.
// Never through a symbolic link (the pid would land in its target, and a
// dangling one would create its target), and only a regular file of this
// user's with no other name: anything else is refused, not written.
int open_lock_file(const std::string& lock_path, const std::string& dir) {
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 && errno != ELOOP && errno != EISDIR) throw unwritable(dir, errno);
  struct stat st {};
  std::string problem;
  if (fd < 0) problem = errno == ELOOP ? "is a symbolic link" : "is a directory";
  else if (::fstat(fd, &st) != 0) problem = std::string("cannot stat it: ") + std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) problem = "is not a regular file";
  else if (st.st_uid != ::geteuid()) problem = "belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  else if (st.st_nlink != 1) problem = "has other names (hard links), which the pid written into it would change";
  if (problem.empty()) return fd;
  if (fd >= 0) ::close(fd);
  throw Error(lock_path + ": " + problem + "; napkin's lock file must be a regular file of yours: remove it or pick "
              "another --checkpoint-dir");
}

}  // namespace

std::string new_run_id() {
  uint64_t bits = 0;
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::read(fd, &bits, sizeof bits) != static_cast<ssize_t>(sizeof bits)) {
    // No /dev/urandom (a bare container): time and pid still separate runs.
    bits = static_cast<uint64_t>(::time(nullptr)) * 6364136223846793005ull ^ static_cast<uint64_t>(::getpid());
  }
  if (fd >= 0) ::close(fd);
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(bits));
  return buf;
}

CheckpointDir::CheckpointDir(std::string dir, Lineage lineage) : dir_(std::move(dir)), lineage_(std::move(lineage)) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw Error(dir_ + ": cannot create the checkpoint directory: " + ec.message());
  if (!fs::is_directory(dir_, ec)) throw Error(dir_ + ": the checkpoint directory is not a directory");

  lock_fd_ = open_lock_file(dir_ + "/" + kLockName, dir_);
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {};
    ssize_t n = ::pread(lock_fd_, pid, sizeof pid - 1, 0);
    std::string holder = n > 0 ? std::string(pid, static_cast<size_t>(n)) : std::string();
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw Error(dir_ + ": another trainer" + (holder.empty() ? "" : " (pid " + printable(holder, 20) + ")") +
                " is writing checkpoints here; wait for it to finish or pick another --checkpoint-dir");
  }
  // From here on a throw must release the lock: a constructor that throws
  // runs no destructor.
  try {
    check_and_clean();
  } catch (...) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw;
  }
}

void CheckpointDir::check_and_clean() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, pid.data(), pid.size(), 0) < 0) {
    // The lock is what matters; the pid is only for the message above.
  }

  // The probe: what the first save will do (create, write, remove a file).
  std::string probe = dir_ + "/.tmp-probe-XXXXXX";
  int fd = ::mkstemp(probe.data());
  if (fd < 0 || ::write(fd, "napkin", 6) != 6) {
    int err = errno;
    if (fd >= 0) ::close(fd), ::unlink(probe.c_str());
    throw unwritable(dir_, err);
  }
  ::close(fd);
  ::unlink(probe.c_str());

  std::vector<std::string> foreign, newer, not_files;
  std::set<int64_t> steps;
  std::vector<int64_t> ambiguous;  // saved both as a file and as a directory
  std::string first_reason;
  fs::directory_iterator it(dir_, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    if (is_checkpoint_temporary(name) || name.starts_with(".tmp-probe-")) {
      std::error_code remove_ec;
      if (fs::remove_all(entry.path(), remove_ec) > 0) ++temporaries_removed_;
      continue;
    }
    std::error_code kind_ec;
    const std::optional<int64_t> file_step = checkpoint_step(name), sharded_step = sharded_checkpoint_step(name);
    const std::optional<int64_t> step = file_step ? file_step : sharded_step;
    if (!step) continue;
    // A directory (or a FIFO, a socket) with a file checkpoint's name, or a
    // file with a sharded one's, would make that step's save fail, hours
    // into the run.
    if (file_step ? !entry.is_regular_file(kind_ec) : !entry.is_directory(kind_ec)) {
      not_files.push_back(entry.path().string());
      continue;
    }
    if (!steps.insert(*step).second) ambiguous.push_back(*step);
    std::string why = foreign_reason(entry.path().string());
    if (why.empty()) {
      if (lineage_.resumed_step >= 0 && *step > lineage_.resumed_step) newer.push_back(name);
      continue;
    }
    foreign.push_back(name);
    if (first_reason.empty()) first_reason = why;
  }
  if (ec) throw Error(dir_ + ": cannot list the checkpoint directory: " + ec.message());
  if (!not_files.empty()) {
    std::sort(not_files.begin(), not_files.end());
    std::string list;
    for (const std::string& path : not_files) list += "\n    " + path;
    throw Error(dir_ + ": holds " + std::to_string(not_files.size()) + " entr" + (not_files.size() == 1 ? "y" : "ies") +
                " named like a checkpoint that " + (not_files.size() == 1 ? "is" : "are") +
                " not a regular file (or, named step-N.sharded, not a directory); the save of that step would fail "
                "on it:" + list +
                "\n  move " + (not_files.size() == 1 ? "it" : "them") + " away, or pick another --checkpoint-dir");
  }
  if (!ambiguous.empty()) {
    std::sort(ambiguous.begin(), ambiguous.end());
    throw Error(dir_ + ": step " + std::to_string(ambiguous.front()) + " is saved both as " +
                checkpoint_filename(ambiguous.front()) + " and as " + sharded_checkpoint_dirname(ambiguous.front()) +
                ": which is the run's is ambiguous; move one of them away");
  }
  if (!foreign.empty()) {
    std::sort(foreign.begin(), foreign.end());
    throw Error(dir_ + ": holds " + std::to_string(foreign.size()) + " checkpoint" + (foreign.size() == 1 ? "" : "s") +
                " that this run did not write (" + some_names(foreign) + "; " + first_reason +
                "), and a run never prunes or overwrites another's files.\n"
                "  to continue that run: --resume " + dir_ + "\n" +
                "  to start afresh: --checkpoint-dir ANOTHER_DIR, or move those files away");
  }
  if (!newer.empty()) {
    std::sort(newer.begin(), newer.end());
    throw Error(dir_ + ": holds " + std::to_string(newer.size()) + " checkpoint" + (newer.size() == 1 ? "" : "s") +
                " of this run newer than step " + std::to_string(lineage_.resumed_step) + ", the one resumed from (" +
                some_names(newer) + "): saving beside them would mix two histories, and pruning would delete them.\n"
                "  to branch from step " + std::to_string(lineage_.resumed_step) +
                ": --checkpoint-dir ANOTHER_DIR\n  to drop the newer ones: move them away first");
  }
}

CheckpointDir::~CheckpointDir() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

std::string CheckpointDir::foreign_reason(const std::string& path) const {
  CheckpointHeader h;
  try {
    h = read_checkpoint_header(path);
  } catch (const Error& e) {
    return std::string("one cannot be read: ") + e.what();
  }
  if (h.model_hash != lineage_.model_hash)
    return "written by another model" +
           (h.metadata.count("model") ? " '" + printable(h.metadata.at("model")) + "'" : std::string()) +
           " or another --dims variant (hash " + h.model_hash + ")";
  if (h.format == 1 && lineage_.adopts_version1) return "";
  if (h.run != lineage_.run)
    return "written by another run of this model (run " + (h.run.empty() ? "unknown" : h.run) + ")";
  return "";
}

void CheckpointDir::check_target(int64_t step, const std::string& path) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string file = dir_ + "/" + checkpoint_filename(step), sharded = dir_ + "/" + sharded_checkpoint_dirname(step);
  const std::string& other = path == file ? sharded : file;
  if (fs::exists(other, ec))
    throw Error(other + ": step " + std::to_string(step) + " is saved there already; saving it as " + path +
                " too would make it ambiguous: move it away and resume with --resume " + dir_);
  if (!fs::exists(path, ec)) return;
  std::string why = foreign_reason(path);
  if (why.empty() && path == sharded) why = "a sharded checkpoint of this run, which a save never replaces";
  if (!why.empty())
    throw Error(path + ": will not overwrite it: " + why + "; move it away and resume with --resume " + dir_);
}

void CheckpointDir::prune(int64_t step, int64_t keep) const {
  if (keep <= 0) return;
  int64_t kept = 0;
  for (const auto& [s, path] : list_checkpoints(dir_)) {
    if (s > step || !foreign_reason(path).empty()) continue;  // not ours, or not behind us: never touched
    if (++kept <= keep) continue;
    if (!sharded_checkpoint_step(std::filesystem::path(path).filename().string())) {
      if (::unlink(path.c_str()) != 0 && errno != ENOENT)
        throw Error(path + ": cannot delete this old checkpoint: " + std::strerror(errno));
      continue;
    }
    // A directory goes in one rename to a temporary's name first: a crash while its files are deleted leaves
    // a temporary (removed at the next start), never a step-N.sharded missing some of them.
    std::string doomed = dir_ + "/.tmp-" + std::filesystem::path(path).filename().string() + "-XXXXXX";
    if (!::mkdtemp(doomed.data()) || std::rename(path.c_str(), doomed.c_str()) != 0)
      throw Error(path + ": cannot delete this old checkpoint: " + std::strerror(errno));
    std::error_code ec;
    std::filesystem::remove_all(doomed, ec);
    if (ec) throw Error(doomed + ": cannot delete this old checkpoint: " + ec.message());
  }
}

std::string CheckpointDir::save(int64_t step, const std::vector<TensorRef>& tensors,
                                const std::map<std::string, std::string>& metadata, int64_t keep) {
  check_target(step, dir_ + "/" + checkpoint_filename(step));
  const std::string path = write_checkpoint(dir_, step, tensors, lineage_.model_hash, lineage_.run, metadata);
  prune(step, keep);
  return path;
}

std::string CheckpointDir::begin_sharded_save(int64_t step) {
  check_target(step, dir_ + "/" + sharded_checkpoint_dirname(step));
  return make_sharded_temporary(dir_, step);
}

std::string CheckpointDir::finish_sharded_save(const std::string& temporary, const ShardedIndex& index, int64_t keep) {
  if (index.model_hash != lineage_.model_hash || index.run != lineage_.run)
    throw std::invalid_argument("finish_sharded_save: the index is not this lineage's");
  const std::string path = dir_ + "/" + sharded_checkpoint_dirname(index.step);
  publish_sharded_checkpoint(temporary, path, index);
  prune(index.step, keep);
  return path;
}

}  // namespace napkin::runtime
