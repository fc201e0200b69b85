#include "runtime/cuda/nccl_collectives.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <nccl.h>

#include <cstdlib>
#include <stdexcept>

#include "runtime/tensor_types.h"

#include "runtime/error.h"

namespace napkin::runtime::cuda {

struct NcclCollectives::Api {
  void* library = nullptr;
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclCommAbort) comm_abort = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclReduce) reduce = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
  ncclComm_t comm = nullptr;

  void check(ncclResult_t r, const char* call) const {
    if (r != ncclSuccess)
      throw Error(fmt::format("{} failed: {} ({})", call, error_string ? error_string(r) : "?", static_cast<int>(r)));
  }
};

namespace {

template <typename F>
void bind(void* library, F& fn, const char* name, const std::string& path) {
  fn = reinterpret_cast<F>(dlsym(library, name));
  if (fn == nullptr) throw Error(fmt::format("{} has no {}: napkin needs NCCL 2.10 or later", path, name));
}

ncclDataType_t nccl_type(DType dtype) {
  if (dtype == DType::F32) return ncclFloat32;
  if (dtype == DType::BF16) return ncclBfloat16;
  if (dtype == DType::F16) return ncclFloat16;
  if (dtype == DType::F64) return ncclFloat64;
  throw Error("a tensor of dtype " + std::string(dtype_name(dtype)) + " cannot be summed by NCCL here");
}

}  // namespace

NcclCollectives::NcclCollectives() : api_(std::make_unique<Api>()) {
  const char* env = std::getenv("NAPKIN_NCCL_LIBRARY");
  const std::string path = env && *env ? env : "libnccl.so.2";
  Api& a = *api_;
  a.library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (a.library == nullptr) {
    const char* why = dlerror();
    throw Error(fmt::format("{} cannot be loaded ({})", path, why ? why : "unknown"));
  }
  bind(a.library, a.get_version, "ncclGetVersion", path);
  bind(a.library, a.get_unique_id, "ncclGetUniqueId", path);
  bind(a.library, a.comm_init_rank, "ncclCommInitRank", path);
  bind(a.library, a.comm_destroy, "ncclCommDestroy", path);
  bind(a.library, a.comm_abort, "ncclCommAbort", path);
  bind(a.library, a.all_reduce, "ncclAllReduce", path);
  bind(a.library, a.broadcast, "ncclBroadcast", path);
  bind(a.library, a.reduce, "ncclReduce", path);
  bind(a.library, a.group_start, "ncclGroupStart", path);
  bind(a.library, a.group_end, "ncclGroupEnd", path);
  bind(a.library, a.error_string, "ncclGetErrorString", path);
  int version = 0;
  a.check(a.get_version(&version), "ncclGetVersion");
  // 2.10 (21000) brought ncclAvg; the code is major*10000 + minor*100 + patch since 2.9.
  if (version < 21000) throw Error(fmt::format("{} is NCCL version code {}: napkin needs 2.10 or later", path, version));
  describe_ = fmt::format("NCCL {}.{}.{}", version / 10000, version / 100 % 100, version % 100);
}

void NcclCollectives::join(Communicator& comm) {
  Api& a = *api_;
  // The bootstrap: rank 0's unique id to every rank, over MPI.
  ncclUniqueId id{};
  if (comm.rank() == 0) a.check(a.get_unique_id(&id), "ncclGetUniqueId");
  comm.broadcast(&id, sizeof id);
  Communicator::Waiting waiting("NCCL's initialization");
  a.check(a.comm_init_rank(&a.comm, comm.size(), id, comm.rank()), "ncclCommInitRank");
}

NcclCollectives::~NcclCollectives() {
  if (api_->comm) api_->comm_destroy(api_->comm);
  if (api_->library) dlclose(api_->library);
}

void NcclCollectives::average_gradients(const Program& program, const std::vector<int>& which,
                                        const std::vector<int>& owners, CUdeviceptr arena, CUstream stream) {
  Api& a = *api_;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  a.check(a.group_start(), "ncclGroupStart");
  for (int i : which) {
    const GradientSpec& g = program.gradients.at(static_cast<size_t>(i));
    void* p = reinterpret_cast<void*>(arena + static_cast<CUdeviceptr>(g.offset));
    const size_t count = static_cast<size_t>(g.numel());
    if (owners.empty())
      a.check(a.all_reduce(p, p, count, nccl_type(g.dtype), ncclAvg, a.comm, s), "ncclAllReduce");
    else
      a.check(a.reduce(p, p, count, nccl_type(g.dtype), ncclAvg, owners.at(static_cast<size_t>(i)), a.comm, s),
              "ncclReduce");
  }
  a.check(a.group_end(), "ncclGroupEnd");
}

void NcclCollectives::collective(const CollectiveSpec& spec, int owner, CUdeviceptr x, CUdeviceptr y, CUstream stream,
                                 bool average) {
  Api& a = *api_;
  void* send = reinterpret_cast<void*>(x);
  void* recv = reinterpret_cast<void*>(y);
  const size_t count = static_cast<size_t>(spec.count);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (spec.collective == "all_reduce_sum")
    a.check(a.all_reduce(send, recv, count, nccl_type(spec.dtype), ncclSum, a.comm, s), "ncclAllReduce");
  else if (spec.collective == "all_gather")  // bytes: a parameter of any dtype
    a.check(a.broadcast(send, recv, count * static_cast<size_t>(element_bytes(spec.dtype)), ncclUint8, owner, a.comm, s),
            "ncclBroadcast");
  else if (spec.collective == "reduce_scatter")
    a.check(a.reduce(send, recv, count, nccl_type(spec.dtype), average ? ncclAvg : ncclSum, owner, a.comm, s),
            "ncclReduce");
  else
    throw std::logic_error("NcclCollectives: unknown collective " + spec.collective);
}

void NcclCollectives::broadcast(const std::vector<const TensorSpec*>& tensors, const std::vector<int>& owners,
                                CUdeviceptr arena, CUstream stream) {
  Api& a = *api_;
  a.check(a.group_start(), "ncclGroupStart");
  for (size_t i = 0; i < tensors.size(); ++i) {
    void* p = reinterpret_cast<void*>(arena + static_cast<CUdeviceptr>(tensors[i]->offset));
    a.check(a.broadcast(p, p, static_cast<size_t>(tensors[i]->bytes), ncclUint8, owners.at(i), a.comm,
                        reinterpret_cast<cudaStream_t>(stream)),
            "ncclBroadcast");
  }
  a.check(a.group_end(), "ncclGroupEnd");
}

}  // namespace napkin::runtime::cuda
