// The MPI communicator (runtime/communicator.h): Open MPI's libmpi, opened
// with dlopen when the launcher says the job has more than one rank, so a
// trainer neither links MPI nor needs it installed to run alone.
//
// Why Open MPI's ABI: MPI standardizes the C API, not the binary one. Open
// MPI's handles (MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM) are the addresses of
// exported objects (ompi_mpi_comm_world, ...), which dlsym finds; MPICH's are
// integer constants of another layout. Debian's MPI, and the one most
// clusters' mpirun comes from, is Open MPI (libmpi.so.40: versions 3 to 5).
// NAPKIN_MPI_LIBRARY names another file of the same ABI.
//
// RTLD_GLOBAL: Open MPI loads its transports as plugins that resolve
// symbols of libmpi itself, which a library opened RTLD_LOCAL hides.
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/error.h"

namespace napkin::runtime {

namespace {

using Handle = void*;  // MPI_Comm, MPI_Datatype, MPI_Op: pointers in Open MPI
// MPI_THREAD_SERIALIZED: one thread at a time calls MPI, not always the
// main one (ZeRO-3's prefetch runs a step's collectives on a thread of their
// own: runtime/parameter_collectives.h).
constexpr int kThreadSerialized = 2;
void* const kInPlace = reinterpret_cast<void*>(1);  // MPI_IN_PLACE

struct MpiApi {
  void* library = nullptr;
  int (*init_thread)(int*, char***, int, int*) = nullptr;
  int (*initialized)(int*) = nullptr;
  int (*finalize)() = nullptr;
  int (*comm_rank)(Handle, int*) = nullptr;
  int (*comm_size)(Handle, int*) = nullptr;
  int (*allreduce)(const void*, void*, int, Handle, Handle, Handle) = nullptr;
  int (*barrier)(Handle) = nullptr;
  int (*bcast)(void*, int, Handle, int, Handle) = nullptr;
  int (*send)(const void*, int, Handle, int, int, Handle) = nullptr;
  int (*recv)(void*, int, Handle, int, int, Handle, void*) = nullptr;
  int (*abort)(Handle, int) = nullptr;
  int (*get_library_version)(char*, int*) = nullptr;
  int (*get_processor_name)(char*, int*) = nullptr;
  int (*allgather)(const void*, int, Handle, void*, int, Handle, Handle) = nullptr;
  int (*reduce_scatter)(const void*, void*, const int*, Handle, Handle, Handle) = nullptr;
  int (*reduce)(const void*, void*, int, Handle, Handle, int, Handle) = nullptr;
  int (*comm_split)(Handle, int, int, Handle*) = nullptr;
  int (*comm_free)(Handle*) = nullptr;
  Handle comm_world = nullptr, type_float = nullptr, type_double = nullptr, type_char = nullptr, op_sum = nullptr;
};

template <typename F>
void bind(MpiApi& api, F& fn, const char* name, const std::string& path) {
  fn = reinterpret_cast<F>(dlsym(api.library, name));
  if (fn == nullptr)
    throw Error(fmt::format("{} has no {}: napkin needs Open MPI's libmpi (ABI of libmpi.so.40)", path, name));
}

Handle object(MpiApi& api, const char* name, const std::string& path) {
  Handle h = dlsym(api.library, name);
  if (h == nullptr)
    throw Error(fmt::format("{} has no {}: napkin needs Open MPI's libmpi (ABI of libmpi.so.40; MPICH's differs)", path,
                            name));
  return h;
}

MpiApi load(const LaunchedRank& launched) {
  const char* env = std::getenv("NAPKIN_MPI_LIBRARY");
  std::string path = env && *env ? env : "libmpi.so.40";
  MpiApi api;
  api.library = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (api.library == nullptr) {
    const char* why = dlerror();
    throw Error(fmt::format("launched as rank {} of {} by {}, but {} cannot be loaded ({}): install Open MPI "
                            "(Debian: apt-get install openmpi-bin) or set NAPKIN_MPI_LIBRARY to its libmpi",
                            launched.rank, launched.size, launched.launcher, path, why ? why : "unknown"));
  }
  bind(api, api.init_thread, "MPI_Init_thread", path);
  bind(api, api.initialized, "MPI_Initialized", path);
  bind(api, api.finalize, "MPI_Finalize", path);
  bind(api, api.comm_rank, "MPI_Comm_rank", path);
  bind(api, api.comm_size, "MPI_Comm_size", path);
  bind(api, api.allreduce, "MPI_Allreduce", path);
  bind(api, api.barrier, "MPI_Barrier", path);
  bind(api, api.bcast, "MPI_Bcast", path);
  bind(api, api.send, "MPI_Send", path);
  bind(api, api.recv, "MPI_Recv", path);
  bind(api, api.abort, "MPI_Abort", path);
  bind(api, api.get_library_version, "MPI_Get_library_version", path);
  bind(api, api.get_processor_name, "MPI_Get_processor_name", path);
  bind(api, api.allgather, "MPI_Allgather", path);
  bind(api, api.reduce_scatter, "MPI_Reduce_scatter", path);
  bind(api, api.reduce, "MPI_Reduce", path);
  bind(api, api.comm_split, "MPI_Comm_split", path);
  bind(api, api.comm_free, "MPI_Comm_free", path);
  api.comm_world = object(api, "ompi_mpi_comm_world", path);
  api.type_float = object(api, "ompi_mpi_float", path);
  api.type_double = object(api, "ompi_mpi_double", path);
  api.type_char = object(api, "ompi_mpi_char", path);
  api.op_sum = object(api, "ompi_mpi_op_sum", path);
  return api;
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const LaunchedRank& launched) : api_(load(launched)) {
    int provided = 0;
    check(api_.init_thread(nullptr, nullptr, kThreadSerialized, &provided), "MPI_Init_thread");
    serialized_ = provided >= kThreadSerialized;
    comm_ = api_.comm_world;
    check(api_.comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(api_.comm_size(comm_, &size_), "MPI_Comm_size");
    if (rank_ != launched.rank || size_ != launched.size)
      throw Error(fmt::format("MPI says this is rank {} of {}, the {} environment rank {} of {}: is the trainer run by "
                              "the mpirun of the MPI it loads?",
                              rank_, size_, launched.launcher, launched.rank, launched.size));
    char version[256] = {0};
    int length = 0;
    api_.get_library_version(version, &length);
    std::string v(version, static_cast<size_t>(std::max(0, std::min(length, 255))));
    if (auto comma = v.find(','); comma != std::string::npos) v.resize(comma);  // "Open MPI v4.1.4, package: ..."
    while (!v.empty() && (v.back() == '\n' || v.back() == ' ' || v.back() == '\0')) v.pop_back();
    hosts_ = count_hosts();
    describe_ = fmt::format("{}, {} ranks on {} host{}", v, size_, hosts_, hosts_ == 1 ? "" : "s");
  }

  // A part of `parent`'s ranks (MPI_Comm_split): MPI stays the parent's to finalize.
  MpiCommunicator(const MpiApi& api, Handle comm, int hosts, bool serialized)
      : api_(api), comm_(comm), split_(true), serialized_(serialized), hosts_(hosts) {
    check(api_.comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(api_.comm_size(comm_, &size_), "MPI_Comm_size");
    describe_ = fmt::format("{} of the job's ranks", size_);
  }

  ~MpiCommunicator() override {
    int on = 0;
    if (split_) {
      if (api_.initialized(&on) == 0 && on) api_.comm_free(&comm_);
      return;
    }
    if (api_.initialized(&on) == 0 && on) api_.finalize();
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    Handle part = nullptr;
    check(api_.comm_split(comm_, color, key, &part), "MPI_Comm_split");
    return std::make_unique<MpiCommunicator>(api_, part, hosts_, serialized_);
  }

  bool serialized_threads() const override { return serialized_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return describe_; }

  void all_reduce_sum(float* data, int64_t count) override { reduce(data, count, api_.type_float, sizeof(float)); }
  void all_reduce_sum(double* data, int64_t count) override { reduce(data, count, api_.type_double, sizeof(double)); }

  void reduce_scatter_sum(float* data, const std::vector<int64_t>& counts) override {
    if (counts.size() != static_cast<size_t>(size_)) throw std::logic_error("reduce_scatter_sum: one count per rank");
    std::vector<int> n(counts.size());
    for (size_t r = 0; r < counts.size(); ++r) {
      if (counts[r] < 0 || counts[r] > INT_MAX) throw std::logic_error("reduce_scatter_sum: a count past INT_MAX");
      n[r] = static_cast<int>(counts[r]);
    }
    Waiting waiting("the reduce-scatter");
    check(api_.reduce_scatter(kInPlace, data, n.data(), api_.type_float, api_.op_sum, comm_),
          "MPI_Reduce_scatter");
  }

  void reduce_sum(const float* mine, float* sum, int64_t count, int root) override {
    Waiting waiting("a reduce");
    // In pieces cut at the same places on every rank; the root receives each piece's sum in place.
    for (int64_t done = 0; done < count;) {
      const int n = static_cast<int>(std::min<int64_t>(count - done, INT_MAX));
      const void* send = rank_ == root && mine == sum ? kInPlace : static_cast<const void*>(mine + done);
      check(api_.reduce(send, rank_ == root ? sum + done : nullptr, n, api_.type_float, api_.op_sum, root,
                        comm_),
            "MPI_Reduce");
      done += n;
    }
  }

  void all_gather(const void* mine, int64_t bytes, void* all) override {
    // A small record (the ranks' agreement): one call, no pieces.
    if (bytes > INT_MAX) throw std::logic_error("MpiCommunicator::all_gather: more than INT_MAX bytes");
    Waiting waiting("an all-gather");
    const int n = static_cast<int>(bytes);
    check(api_.allgather(mine, n, api_.type_char, all, n, api_.type_char, comm_), "MPI_Allgather");
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    Waiting waiting("a broadcast");
    in_pieces(data, bytes, 1, [&](char* p, int n) {
      check(api_.bcast(p, n, api_.type_char, root, comm_), "MPI_Bcast");
    });
  }

  void send(const void* data, int64_t bytes, int to) override {
    Waiting waiting("a send");
    in_pieces(const_cast<void*>(data), bytes, 1, [&](char* p, int n) {
      check(api_.send(p, n, api_.type_char, to, 0, comm_), "MPI_Send");
    });
  }

  void receive(void* data, int64_t bytes, int from) override {
    Waiting waiting("a receive");
    in_pieces(data, bytes, 1, [&](char* p, int n) {
      // MPI_STATUS_IGNORE is a null pointer in Open MPI.
      check(api_.recv(p, n, api_.type_char, from, 0, comm_, nullptr), "MPI_Recv");
    });
  }

  void barrier() override {
    Waiting waiting("a barrier");
    check(api_.barrier(comm_), "MPI_Barrier");
  }

  [[noreturn]] void abort(int status) override {
    api_.abort(comm_, status);
    std::_Exit(status);  // MPI_Abort does not return; if it did, end this rank anyway
  }

 private:
  // MPI counts are int: a longer buffer goes in pieces of at most INT_MAX
  // elements, always cut at the same places, so the sums stay deterministic.
  template <typename Call>
  static void in_pieces(void* data, int64_t count, size_t element, Call call) {
    char* p = static_cast<char*>(data);
    for (int64_t done = 0; done < count;) {
      const int n = static_cast<int>(std::min<int64_t>(count - done, INT_MAX));
      call(p + static_cast<size_t>(done) * element, n);
      done += n;
    }
  }

  void reduce(void* data, int64_t count, Handle type, size_t element) {
    Waiting waiting("the all-reduce");
    in_pieces(data, count, element, [&](char* p, int n) {
      check(api_.allreduce(kInPlace, p, n, type, api_.op_sum, comm_), "MPI_Allreduce");
    });
  }

  // The number of distinct processor names among the ranks.
  int count_hosts() {
    constexpr int kName = 256;
    char mine[kName] = {0};
    int length = 0;
    api_.get_processor_name(mine, &length);
    std::string all(static_cast<size_t>(kName) * static_cast<size_t>(size_), '\0');
    check(api_.allgather(mine, kName, api_.type_char, all.data(), kName, api_.type_char, comm_),
          "MPI_Allgather");
    int hosts = 0;
    for (int r = 0; r < size_; ++r) {
      std::string name(all.data() + static_cast<size_t>(r) * kName);
      bool seen = false;
      for (int q = 0; q < r && !seen; ++q) seen = name == std::string(all.data() + static_cast<size_t>(q) * kName);
      hosts += seen ? 0 : 1;
    }
    return hosts;
  }

  void check(int status, const char* call) {
    // Open MPI's default error handler aborts the job before returning an
    // error; with another handler installed, a failure still ends this rank.
    if (status != 0) throw Error(fmt::format("rank {}: {} failed (MPI error {})", rank_, call, status));
  }

  MpiApi api_;
  Handle comm_ = nullptr;  // the world, or a split's part of it
  bool split_ = false;
  bool serialized_ = false;  // MPI provides MPI_THREAD_SERIALIZED
  int rank_ = 0, size_ = 1, hosts_ = 1;
  std::string describe_;
};

}  // namespace

std::unique_ptr<Communicator> open_mpi_communicator(const LaunchedRank& launched) {
  return std::make_unique<MpiCommunicator>(launched);
}

}  // namespace napkin::runtime
