// How the ranks of a data-parallel job talk: the collectives a trainer needs
// (sum-all-reduce of gradients and of the step's scalars, ZeRO-2's
// reduce-scatter of the gradients, a barrier) and who
// this process is. One process is a communicator of one rank whose
// collectives do nothing; a job launched by mpirun or srun with more than one
// rank talks through MPI (runtime/mpi_communicator.cpp), loaded with dlopen
// so that a trainer starts anywhere without it. docs/distributed.md.
//
// Terms:
//  - rank, size: this process's index in the job and the number of ranks,
//    as the launcher's environment says (OMPI_COMM_WORLD_RANK/SIZE under
//    Open MPI's mpirun, PMIX_RANK or SLURM_PROCID/SLURM_NTASKS under srun).
//  - deterministic: a collective gives every rank the same bits, and the
//    same bits on every run with the same rank count (MPI reduces in an
//    order fixed by the communicator and the message size).
//  - watchdog: a collective that waits longer than the timeout for the other
//    ranks (one hung or died without the launcher noticing) ends this
//    process with a message naming its rank and what it was doing (the
//    trainer sets that: "step 12, the gradient all-reduce"), so the launcher
//    ends the job.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace napkin::runtime {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "one process" / "Open MPI v4.1.4, 2 ranks on 1 host".
  virtual std::string describe() const = 0;
  // Whether a thread other than the main one may make the calls, one thread
  // at a time (MPI_THREAD_SERIALIZED): ZeRO-3's prefetch thread
  // (runtime/parameter_collectives.h).
  virtual bool serialized_threads() const { return false; }

  // Sums `count` elements over the ranks, in place, deterministically.
  virtual void all_reduce_sum(float* data, int64_t count) = 0;
  virtual void all_reduce_sum(double* data, int64_t count) = 0;
  // ZeRO-2's gradient sum: `data` holds counts[0] + ... + counts[size()-1]
  // elements, rank r's part after the parts of the ranks before it; every
  // rank's are summed and this rank's sum is left at the start of `data`
  // (data[0, counts[rank()])); the rest of `data` is then undefined. In place
  // (MPI_Reduce_scatter with MPI_IN_PLACE), deterministic. Counts up to
  // INT_MAX each (callers go in buckets).
  virtual void reduce_scatter_sum(float* data, const std::vector<int64_t>& counts) = 0;
  // ZeRO-3's gradient of one parameter: the sum over the ranks of each
  // rank's `count` elements at `mine`, into `sum` on rank `root` alone (the
  // parameter's owner; `sum` is not touched elsewhere; it may be `mine`).
  // MPI_Reduce.
  virtual void reduce_sum(const float* mine, float* sum, int64_t count, int root) = 0;
  // Every rank's `bytes` bytes at `mine`, in rank order, to every rank:
  // `all` holds size() × bytes.
  virtual void all_gather(const void* mine, int64_t bytes, void* all) = 0;
  // Rank `root`'s `bytes` bytes at `data` to every rank.
  virtual void broadcast(void* data, int64_t bytes, int root = 0) = 0;
  // Point to point: `bytes` bytes to rank `to`, or from rank `from`.
  virtual void send(const void* data, int64_t bytes, int to) = 0;
  virtual void receive(void* data, int64_t bytes, int from) = 0;
  virtual void barrier() = 0;
  // The ranks of this communicator with the same `color`, as a communicator
  // of their own, ranked by `key` (MPI_Comm_split): every rank calls it.
  // Hybrid sharding's groups and replicas (runtime/parameter_collectives.h).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Ends every rank of the job with `status` (MPI_Abort): what a rank that
  // met an error does, so that the others do not wait for it forever.
  [[noreturn]] virtual void abort(int status) = 0;

  // What this rank is doing, for the watchdog's and the launcher-kill
  // messages ("step 12"); copied, so any string will do.
  void set_activity(const std::string& activity);
  // True while this rank waits in a collective (read by the trainer's signal
  // thread, runtime/stop_signals.h).
  static bool in_collective();
  // Marks the calling thread as one whose waits in collectives are not the
  // rank's (Waiting below), for the rest of its life.
  static void in_background();
  // On a SIGINT or SIGTERM (async-signal-safe): says on stderr
  // that this rank, at its activity, was stopped by `sig` while waiting for
  // the others, i.e. the launcher is ending the job.
  static void write_stopped_by_signal(int sig);

  // RAII marker around each wait for the other ranks (a collective, or a
  // GPU stream running one): the watchdog times it. `what` must outlive it.
  // On a thread marked by in_background() it marks nothing: that thread's
  // waits are not the rank's (ZeRO-3's collectives thread, whose results the
  // rank waits for, marked, where it needs them).
  class Waiting {
   public:
    explicit Waiting(const char* what);
    ~Waiting();
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;
  };
};

// The communicator for this process: one rank unless the launcher's
// environment says the job has more, then MPI. timeout_seconds: the
// watchdog's limit on one collective (0: none). Throws Error when the job has
// several ranks but MPI cannot be loaded or initialized, saying why.
std::unique_ptr<Communicator> open_communicator(double timeout_seconds);

// The rank and size the launcher's environment gives this process ({0, 1}
// when it was not launched by mpirun or srun).
struct LaunchedRank {
  int rank = 0, size = 1;
  int local_rank = 0;    // among the ranks of this host: which GPU a CUDA trainer takes
  std::string launcher;  // "mpirun", "srun" or "" (a single process)
};
LaunchedRank launched_rank();

// Writes `line` and a newline to stderr with one write(2): safe in a signal
// handler, and whole when several ranks share the terminal.
void write_stderr_line(const std::string& line);

}  // namespace napkin::runtime
