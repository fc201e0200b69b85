// The fake GPU's NCCL (fake_cuda.h defines the device; nccl.h every
// signature): what runtime/cuda/nccl_collectives.cpp calls, so that CUDA
// trainers launched by mpirun on fake GPUs average their gradients through
// the same NCCL calls a real job makes. Loaded as libnccl.so.2 (a symlink to
// this library).
//
// Terms:
//  - transport: the ranks are processes, each with its own fake device
//    memory (host memory), so the fake moves the bytes with the MPI the
//    trainer already loaded (dlopen RTLD_GLOBAL: its symbols are found with
//    RTLD_DEFAULT): an all-reduce is MPI_Allreduce of the device bytes, in
//    the process's stream order (an Op on the fake stream, run when the
//    stream runs it).
//  - collectives: ncclAllReduce (MPI_Allreduce), ncclBroadcast (MPI_Bcast of
//    the bytes, any dtype; out of place the root's sendbuff lands in every
//    rank's recvbuff) and ncclReduce (MPI_Reduce onto the root; a non-root's
//    recvbuff is neither checked nor written, as NCCL ignores it).
//  - checked as NCCL would fail: buffers outside device memory, a count or
//    rank out of range, a dtype or op the fake does not have (sums: f32 and
//    f64; sum and avg), a communicator made with another unique id than
//    rank 0's.
//  - avg: the sum divided by the rank count, in the dtype.
//  - report: with NAPKIN_FAKE_NCCL_REPORT=PREFIX, the process writes
//    PREFIX.RANK.json at exit (RANK from Open MPI's OMPI_COMM_WORLD_RANK,
//    else 0): {"all_reduce": calls, "broadcast": calls, "reduce": calls},
//    each counted when enqueued (or captured), so that a test can tell
//    which collectives a trainer ran on the device.
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fake_cuda/fake_cuda.h"

using napkin::fake_cuda::Fake;

struct ncclComm {
  int ranks = 1, rank = 0;
};

namespace {

// Open MPI's ABI, as runtime/mpi_communicator.cpp uses it.
using Handle = void*;
using AllreduceFn = int (*)(const void*, void*, int, Handle, Handle, Handle);
using BcastFn = int (*)(void*, int, Handle, int, Handle);
using ReduceFn = int (*)(const void*, void*, int, Handle, Handle, int, Handle);
constexpr uintptr_t kInPlace = 1;  // MPI_IN_PLACE

struct Mpi {
  AllreduceFn allreduce = nullptr;
  BcastFn bcast = nullptr;
  ReduceFn reduce = nullptr;
  Handle world = nullptr, f32 = nullptr, f64 = nullptr, byte = nullptr, sum = nullptr;
  bool found() const { return allreduce && bcast && reduce && world && f32 && f64 && byte && sum; }
};

Mpi mpi() {
  Mpi m;
  m.allreduce = reinterpret_cast<AllreduceFn>(dlsym(RTLD_DEFAULT, "MPI_Allreduce"));
  m.bcast = reinterpret_cast<BcastFn>(dlsym(RTLD_DEFAULT, "MPI_Bcast"));
  m.reduce = reinterpret_cast<ReduceFn>(dlsym(RTLD_DEFAULT, "MPI_Reduce"));
  m.world = dlsym(RTLD_DEFAULT, "ompi_mpi_comm_world");
  m.f32 = dlsym(RTLD_DEFAULT, "ompi_mpi_float");
  m.f64 = dlsym(RTLD_DEFAULT, "ompi_mpi_double");
  m.byte = dlsym(RTLD_DEFAULT, "ompi_mpi_char");
  m.sum = dlsym(RTLD_DEFAULT, "ompi_mpi_op_sum");
  return m;
}

ncclResult_t refuse(const std::string& why) {
  std::fprintf(stderr, "napkin fake NCCL: %s\n", why.c_str());
  return ncclInvalidArgument;
}

// Calls per collective, written at exit (the report above).
struct Counts {
  long all_reduce = 0, broadcast = 0, reduce = 0;
  ~Counts() {
    const char* prefix = std::getenv("NAPKIN_FAKE_NCCL_REPORT");
    if (!prefix || !*prefix) return;
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    const std::string path = std::string(prefix) + "." + (rank ? rank : "0") + ".json";
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::fprintf(f, "{\"all_reduce\": %ld, \"broadcast\": %ld, \"reduce\": %ld}\n", all_reduce, broadcast, reduce);
      std::fclose(f);
    }
  }
};
Counts counts;

// Bytes of one element of `datatype`, 0 for one the fake does not know.
size_t element_bytes(ncclDataType_t datatype) {
  switch (datatype) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

// What a sum's arguments must be here, or why not ("" when they are fine).
std::string check_sum(const char* call, ncclDataType_t datatype, ncclRedOp_t op, size_t count, ncclComm_t comm) {
  const std::string name = call;
  if (comm == nullptr) return name + ": no communicator";
  if (datatype != ncclFloat32 && datatype != ncclFloat64) return name + ": the fake has f32 and f64 only";
  if (op != ncclSum && op != ncclAvg) return name + ": the fake has sum and avg only";
  if (count > (size_t{1} << 31) - 1) return name + ": count beyond the fake's MPI int";
  return "";
}

template <typename T>
void divide(void* p, size_t count, int ranks) {
  T* v = static_cast<T*>(p);
  for (size_t i = 0; i < count; ++i) v[i] /= static_cast<T>(ranks);
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  *version = 22800;  // 2.28.0, the toolkit's nccl.h
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (napkin fake NCCL)";
    case ncclSystemError: return "system error (napkin fake NCCL)";
    default: return "error (napkin fake NCCL)";
  }
}

// Rank 0's id: its pid, so that a rank given another id is caught.
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof *id);
  std::snprintf(id->internal, sizeof id->internal, "napkin-fake-nccl-%d", static_cast<int>(::getpid()));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return refuse("ncclCommInitRank: rank out of range");
  if (std::strncmp(id.internal, "napkin-fake-nccl-", 17) != 0) return refuse("ncclCommInitRank: not a unique id");
  if (nranks > 1) {
    Mpi m = mpi();
    if (!m.found()) return refuse("ncclCommInitRank: the fake moves bytes with MPI, and no MPI is loaded");
    ncclUniqueId root = id;  // every rank must hold rank 0's id
    m.bcast(root.internal, static_cast<int>(sizeof root.internal), m.byte, 0, m.world);
    if (std::memcmp(root.internal, id.internal, sizeof id.internal) != 0)
      return refuse("ncclCommInitRank: this rank's unique id is not rank 0's");
  }
  *comm = new ncclComm{nranks, rank};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (std::string why = check_sum("ncclAllReduce", datatype, op, count, comm); !why.empty()) return refuse(why);
  const size_t element = element_bytes(datatype);
  Fake& fake = Fake::get();
  if (!fake.device_region(sendbuff, count * element) || !fake.device_region(recvbuff, count * element))
    return refuse("ncclAllReduce: a buffer outside device memory");
  const int ranks = comm->ranks;
  ++counts.all_reduce;
  CUresult r = fake.submit(reinterpret_cast<CUstream>(stream), [=]() -> CUresult {
    if (sendbuff != recvbuff) std::memmove(recvbuff, sendbuff, count * element);
    if (ranks > 1) {
      Mpi m = mpi();
      if (m.allreduce(reinterpret_cast<const void*>(kInPlace), recvbuff, static_cast<int>(count),
                      datatype == ncclFloat64 ? m.f64 : m.f32, m.sum, m.world) != 0)
        return CUDA_ERROR_UNKNOWN;
    }
    if (op == ncclAvg) datatype == ncclFloat64 ? divide<double>(recvbuff, count, ranks) : divide<float>(recvbuff, count, ranks);
    return CUDA_SUCCESS;
  });
  return r == CUDA_SUCCESS ? ncclSuccess : ncclUnhandledCudaError;
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr) return refuse("ncclBroadcast: no communicator");
  if (root < 0 || root >= comm->ranks) return refuse("ncclBroadcast: root out of range");
  const size_t element = element_bytes(datatype);
  if (element == 0) return refuse("ncclBroadcast: a dtype the fake does not know");
  const size_t bytes = count * element;
  if (bytes > (size_t{1} << 31) - 1) return refuse("ncclBroadcast: count beyond the fake's MPI int");
  Fake& fake = Fake::get();
  const bool is_root = comm->rank == root;
  if (!fake.device_region(recvbuff, bytes) || (is_root && !fake.device_region(sendbuff, bytes)))
    return refuse("ncclBroadcast: a buffer outside device memory");
  const int ranks = comm->ranks;
  ++counts.broadcast;
  CUresult r = fake.submit(reinterpret_cast<CUstream>(stream), [=]() -> CUresult {
    if (is_root && sendbuff != recvbuff) std::memmove(recvbuff, sendbuff, bytes);
    if (ranks > 1) {
      Mpi m = mpi();
      if (m.bcast(recvbuff, static_cast<int>(bytes), m.byte, root, m.world) != 0) return CUDA_ERROR_UNKNOWN;
    }
    return CUDA_SUCCESS;
  });
  return r == CUDA_SUCCESS ? ncclSuccess : ncclUnhandledCudaError;
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  if (std::string why = check_sum("ncclReduce", datatype, op, count, comm); !why.empty()) return refuse(why);
  if (root < 0 || root >= comm->ranks) return refuse("ncclReduce: root out of range");
  const size_t element = element_bytes(datatype);
  Fake& fake = Fake::get();
  const bool is_root = comm->rank == root;
  if (!fake.device_region(sendbuff, count * element) || (is_root && !fake.device_region(recvbuff, count * element)))
    return refuse("ncclReduce: a buffer outside device memory");
  const int ranks = comm->ranks;
  ++counts.reduce;
  CUresult r = fake.submit(reinterpret_cast<CUstream>(stream), [=]() -> CUresult {
    if (is_root && sendbuff != recvbuff) std::memmove(recvbuff, sendbuff, count * element);
    if (ranks > 1) {
      Mpi m = mpi();
      const void* send = is_root ? reinterpret_cast<const void*>(kInPlace) : sendbuff;
      if (m.reduce(send, is_root ? recvbuff : nullptr, static_cast<int>(count), datatype == ncclFloat64 ? m.f64 : m.f32,
                   m.sum, root, m.world) != 0)
        return CUDA_ERROR_UNKNOWN;
    }
    if (is_root && op == ncclAvg)
      datatype == ncclFloat64 ? divide<double>(recvbuff, count, ranks) : divide<float>(recvbuff, count, ranks);
    return CUDA_SUCCESS;
  });
  return r == CUDA_SUCCESS ? ncclSuccess : ncclUnhandledCudaError;
}

}  // extern "C"
