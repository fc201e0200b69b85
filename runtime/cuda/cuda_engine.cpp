#include "runtime/cuda/cuda_engine.h"

#include <fmt/format.h>

#include <numeric>
#include <optional>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "runtime/communicator.h"
#include "runtime/error.h"
#include "runtime/tensor_element.h"

namespace napkin::runtime::cuda {

namespace {

constexpr uint64_t kWorkspaceBytes = 32ull << 20;
constexpr int kDefaultSharedBytes = 48 << 10;  // above this a function must opt in
constexpr size_t kHostAlign = 64;

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

Error no_gpu(const std::string& why) {
  return Error("this trainer runs its step on an NVIDIA GPU, and " + why +
               "; build with `napkin build --target cpu` to train on this machine");
}

}  // namespace

std::array<void*, 3> kernel_params(CUdeviceptr& arena, CUdeviceptr& scratch, std::vector<long long>& offsets) {
  return {&arena, &scratch, offsets.data()};
}

CudaEngine::CudaEngine(const Program& program, std::string_view cubin, std::string_view ptx) : program_(program) {
  const char* graphs = std::getenv("NAPKIN_CUDA_GRAPHS");
  graphs_enabled_ = !(graphs && std::string_view(graphs) == "0");
  kernel_seconds_.assign(program.kernels.size(), 0.0);
  setup_ = {0, program.num_setup_kernels, false};
  forward_ = {program.num_setup_kernels, program.num_forward_kernels, false};
  backward_ = {program.num_forward_kernels, program.num_gradient_kernels, false};
  optimizer_ = {program.num_gradient_kernels, static_cast<int>(program.kernels.size()), true};
  decode_ = {program.num_forward_kernels, static_cast<int>(program.kernels.size()), false};
  try {
    open_device();
    load_module(cubin, ptx);
    allocate();
    prepare_kernels();
    NAPKIN_CU(*driver_, cuStreamSynchronize(stream_));  // the bad index's reset
  } catch (...) {
    tear_down();
    throw;
  }
}

CudaEngine::~CudaEngine() { tear_down(); }

void CudaEngine::open_device() {
  try {
    driver_ = std::make_unique<CudaDriver>();
  } catch (const Error& e) {
    throw no_gpu(e.what());
  }
  CudaDriver& d = *driver_;
  if (CUresult r = d.cuInit(0); r != CUDA_SUCCESS) throw no_gpu("cuInit failed: " + d.error_text(r));
  int count = 0;
  NAPKIN_CU(d, cuDeviceGetCount(&count));
  if (count == 0) throw no_gpu("the NVIDIA driver sees no GPU");
  // The ranks of a job on one host take one GPU each, by local rank.
  const LaunchedRank launched = launched_rank();
  ordinal_ = launched.local_rank % count;
  NAPKIN_CU(d, cuDeviceGet(&device_, ordinal_));
  NAPKIN_CU(d, cuDevicePrimaryCtxRetain(&context_, device_));
  NAPKIN_CU(d, cuCtxSetCurrent(context_));
  // Non-blocking: never implicitly ordered after the legacy default stream,
  // which nothing here uses; capture needs a stream other than it anyway.
  NAPKIN_CU(d, cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
  NAPKIN_CU(d, cuEventCreate(&kernel_start_, CU_EVENT_DEFAULT));
  NAPKIN_CU(d, cuEventCreate(&kernel_end_, CU_EVENT_DEFAULT));
}

void CudaEngine::load_module(std::string_view cubin, std::string_view ptx) {
  CudaDriver& d = *driver_;
  char name[256] = {};
  NAPKIN_CU(d, cuDeviceGetName(name, sizeof(name) - 1, device_));
  int major = 0, minor = 0;
  NAPKIN_CU(d, cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_));
  NAPKIN_CU(d, cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_));
  std::string gpu = ordinal_ > 0 ? fmt::format("GPU {}: {}, sm_{}{}", ordinal_, name, major, minor)
                                 : fmt::format("{}, sm_{}{}", name, major, minor);

  std::string why;
  if (!cubin.empty()) {
    // The symbol's alignment is whatever the data object gave it; the ELF
    // reader is handed an 8-byte aligned copy.
    std::vector<uint64_t> image((cubin.size() + 7) / 8);
    std::memcpy(image.data(), cubin.data(), cubin.size());
    CUresult r = d.cuModuleLoadData(&module_, image.data());
    if (r == CUDA_SUCCESS) {
      describe_ = gpu + ", cubin";
      return;
    }
    if (r != CUDA_ERROR_NO_BINARY_FOR_GPU && r != CUDA_ERROR_INVALID_IMAGE)
      check_call(d, r, "cuModuleLoadData", __FILE__, __LINE__);
    why = fmt::format("the trainer's {} cubin does not run on this GPU ({})", program_.cuda.arch, d.error_text(r));
  } else {
    why = "the trainer carries no cubin";
  }
  if (ptx.empty()) throw Error(fmt::format("{}: {}, and no PTX to compile for it", gpu, why));
  std::string text(ptx);  // the driver reads PTX up to a NUL
  std::vector<char> log(1 << 16, '\0');
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {log.data(), reinterpret_cast<void*>(static_cast<uintptr_t>(log.size() - 1))};
  CUresult r = d.cuModuleLoadDataEx(&module_, text.c_str(), 2, options, values);
  if (r != CUDA_SUCCESS)
    throw Error(fmt::format("{}: {}, and JIT-compiling its PTX failed: {}{}{}", gpu, why,
                            call_failed_message(__FILE__, __LINE__, "cuModuleLoadDataEx", d.error_text(r)),
                            log[0] ? "\n" : "", log.data()));
  describe_ = fmt::format("{}, PTX JIT from {}", gpu, program_.cuda.arch);
}

void CudaEngine::allocate() {
  CudaDriver& d = *driver_;
  // Reserved now, mapped by the first work on it: a ZeRO rank releases the others' state before that.
  arena_memory_ = std::make_unique<DeviceArena>(d, device_, static_cast<size_t>(std::max<int64_t>(program_.arena_bytes, 1)));
  arena_ = arena_memory_->base();
  if (program_.cuda.scratch_bytes > 0)
    NAPKIN_CU(d, cuMemAlloc(&scratch_, static_cast<size_t>(program_.cuda.scratch_bytes)));

  // One pinned block: every named tensor, then the bad index's readback.
  size_t bytes = 0;
  std::vector<std::pair<const TensorSpec*, size_t>> places;
  for (const TensorSpec& t : program_.tensors) {
    places.push_back({&t, bytes});
    bytes = align_up(bytes + static_cast<size_t>(t.bytes), kHostAlign);
  }
  size_t bad_index_at = bytes;
  bytes += 3 * sizeof(long long);
  void* pinned = nullptr;
  NAPKIN_CU(d, cuMemHostAlloc(&pinned, bytes, 0));
  pinned_ = static_cast<char*>(pinned);
  std::memset(pinned_, 0, bytes);
  for (auto [t, at] : places) host_[t->name] = pinned_ + at;
  bad_index_host_ = reinterpret_cast<long long*>(pinned_ + bad_index_at);

  size_t global_bytes = 0;
  CUresult r = d.cuModuleGetGlobal(&bad_index_, &global_bytes, module_, "napkin_bad_index");
  if (r == CUDA_ERROR_NOT_FOUND) {
    bad_index_ = 0;  // no kernel reads ids
  } else {
    check_call(d, r, "cuModuleGetGlobal", __FILE__, __LINE__);
    if (global_bytes != 3 * sizeof(long long))
      throw Error(fmt::format("the module's napkin_bad_index is {} bytes, not 3 x 8", global_bytes));
    bad_index_host_[0] = -1;
    NAPKIN_CU(d, cuMemcpyHtoDAsync(bad_index_, bad_index_host_, global_bytes, stream_));
  }

  bool any_matmul = false;  // the classifier's GEMMs run on cuBLASLt too
  for (const KernelSpec& k : program_.kernels) any_matmul |= k.as<MatmulSpec>() || k.as<ClassifierSpec>();
  if (any_matmul) {
    lt_ = std::make_unique<CublasLt>();
    NAPKIN_CUBLASLT(*lt_, cublasLtCreate(&lt_handle_));
    NAPKIN_CU(d, cuMemAlloc(&workspace_, kWorkspaceBytes));
    lt_context_ = std::make_unique<LtContext>(LtContext{d, *lt_, lt_handle_, workspace_, kWorkspaceBytes});
  }
}

void CudaEngine::prepare_kernels() {
  // The CPU runtime moves updates with memmove; a device copy must not overlap.
  for (const UpdateSpec& u : program_.updates)
    if (u.from != u.to && u.from < u.to + u.bytes && u.to < u.from + u.bytes)
      throw Error(fmt::format("the update of {} copies between overlapping bytes [{}, +{}) and [{}, +{})", u.target,
                              u.from, u.bytes, u.to, u.bytes));
  CudaDriver& d = *driver_;
  auto attribute = [&](CUdevice_attribute a) {
    int v = 0;
    NAPKIN_CU(d, cuDeviceGetAttribute(&v, a, device_));
    return v;
  };
  int max_shared = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  int max_block = attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  int max_grid = attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
  std::unordered_map<std::string, CUfunction> functions;
  std::unordered_map<CUfunction, int> shared_opted;  // the dynamic shared memory each function was allowed
  auto load_launches = [&](const KernelSpec& k) {
    if (k.cuda_launches.empty()) throw Error(fmt::format("kernel {}: the program gives it no CUDA launches", k.name));
    Launches launches;
    for (const CudaLaunchSpec& l : k.cuda_launches) {
      if (l.grid < 1 || l.grid > max_grid || l.block < 1 || l.block > max_block || l.shared_bytes < 0 ||
          l.shared_bytes > max_shared)
        throw Error(fmt::format("kernel {}: launch of {} ({} blocks of {} threads, {} bytes of shared memory) does "
                                "not fit this GPU (at most {} blocks of {} threads, {} bytes)",
                                k.name, l.function, l.grid, l.block, l.shared_bytes, max_grid, max_block, max_shared));
      auto [it, fresh] = functions.try_emplace(l.function, nullptr);
      if (fresh) {
        CUresult r = d.cuModuleGetFunction(&it->second, module_, l.function.c_str());
        if (r != CUDA_SUCCESS)
          throw Error(call_failed_message(__FILE__, __LINE__, "cuModuleGetFunction", d.error_text(r)) + " for " +
                      l.function);
      }
      CUfunction f = it->second;
      // The offsets are the function's by-value NapkinOffsets<N>: the driver
      // copies as many bytes as the cubin says the parameter has.
      size_t param_offset = 0, param_bytes = 0;
      NAPKIN_CU(d, cuFuncGetParamInfo(f, 2, &param_offset, &param_bytes));
      if (l.offsets.empty() || param_bytes != l.offsets.size() * sizeof(long long))
        throw Error(fmt::format("kernel {}: {} takes {} bytes of operand offsets, and the program gives {} offsets", k.name,
                                l.function, param_bytes, l.offsets.size()));
      for (int64_t o : l.offsets)
        if (o < 0 || o >= std::max<int64_t>(program_.arena_bytes, 1))
          throw Error(fmt::format("kernel {}: operand offset {} of {} is outside the arena ({} bytes)", k.name, o,
                                  l.function, program_.arena_bytes));
      if (l.shared_bytes > kDefaultSharedBytes && l.shared_bytes > shared_opted[f]) {
        NAPKIN_CU(d, cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, l.shared_bytes));
        shared_opted[f] = l.shared_bytes;
      }
      launches.push_back({f, static_cast<unsigned>(l.grid), static_cast<unsigned>(l.block),
                          static_cast<unsigned>(l.shared_bytes), std::vector<long long>(l.offsets.begin(), l.offsets.end())});
    }
    return launches;
  };
  for (const KernelSpec& k : program_.kernels) {
    try {
      runners_.push_back(std::visit(
          overloaded{
              [&](const LoopSpec&) -> Runner { return load_launches(k); },
              [&](const AttentionSpec&) -> Runner { return load_launches(k); },
              [&](const CachedAttentionSpec&) -> Runner { return load_launches(k); },
              [&](const RopeSpec&) -> Runner { return load_launches(k); },
              [&](const CollectiveSpec&) -> Runner { return load_launches(k); },
              [&](const TopKSpec&) -> Runner { return load_launches(k); },
              [&](const MoeSlotsSpec&) -> Runner { return load_launches(k); },
              [&](const MatmulSpec& s) -> Runner {
                return std::make_unique<LtMatmul>(*lt_context_, s, program_.cuda.tf32, k.name, arena_);
              },
              [&](const ClassifierSpec&) -> Runner {
                Launches l = load_launches(k);
                if (!scratch_) throw Error("a classifier needs the scratch buffer, and it has 0 bytes");
                return ClassifierRunner{std::move(l), std::make_unique<CudaClassifier>(*lt_context_, k, program_.cuda.tf32,
                                                                                      arena_, scratch_)};
              },
          },
          k.payload));
    } catch (const Error& e) {
      throw Error(std::string(e.what()).rfind("kernel ", 0) == 0 ? e.what() : "kernel " + k.name + ": " + e.what());
    }
  }
}

void CudaEngine::tear_down() noexcept {
  if (!driver_) return;
  CudaDriver& d = *driver_;
  // Pending work may still use what is freed below.
  if (stream_) d.cuStreamSynchronize(stream_);
  if (comm_stream_) d.cuStreamSynchronize(comm_stream_);
  for (Phase* p : {&setup_, &forward_, &backward_, &optimizer_, &decode_})
    if (p->graph) d.cuGraphExecDestroy(p->graph), p->graph = nullptr;
  for (Phase& p : segments_)
    if (p.graph) d.cuGraphExecDestroy(p.graph), p.graph = nullptr;
  nccl_.reset();
  for (CUevent& e : segment_done_)
    if (e) d.cuEventDestroy(e), e = nullptr;
  if (comm_done_) d.cuEventDestroy(comm_done_), comm_done_ = nullptr;
  if (comm_stream_) d.cuStreamDestroy(comm_stream_), comm_stream_ = nullptr;
  runners_.clear();
  lt_context_.reset();
  if (lt_handle_) lt_->cublasLtDestroy(lt_handle_), lt_handle_ = nullptr;
  if (inspect_host_) d.cuMemFreeHost(inspect_host_), inspect_host_ = nullptr;
  if (pinned_) d.cuMemFreeHost(pinned_), pinned_ = nullptr;
  host_.clear();
  for (CUdeviceptr* p : {&workspace_, &scratch_})
    if (*p) d.cuMemFree(*p), *p = 0;
  arena_memory_.reset();
  arena_ = 0;
  if (module_) d.cuModuleUnload(module_), module_ = nullptr;
  if (kernel_start_) d.cuEventDestroy(kernel_start_), kernel_start_ = nullptr;
  if (kernel_end_) d.cuEventDestroy(kernel_end_), kernel_end_ = nullptr;
  if (stream_) d.cuStreamDestroy(stream_), stream_ = nullptr;
  if (context_) d.cuDevicePrimaryCtxRelease(device_), context_ = nullptr;
}

char* CudaEngine::host(const TensorSpec& t) {
  auto it = host_.find(t.name);
  if (it == host_.end()) throw Error(fmt::format("{} ({}) has no host buffer", t.name, tensor_role_name(t.role)));
  return it->second;
}

void CudaEngine::copy_up(int64_t offset, const void* src, int64_t bytes) {
  arena_memory_->back(stream_);
  NAPKIN_CU(*driver_, cuMemcpyHtoDAsync(arena_ + static_cast<CUdeviceptr>(offset), src, static_cast<size_t>(bytes),
                                        stream_));
}

void CudaEngine::copy_down(void* dst, int64_t offset, int64_t bytes) {
  arena_memory_->back(stream_);
  NAPKIN_CU(*driver_, cuMemcpyDtoHAsync(dst, arena_ + static_cast<CUdeviceptr>(offset), static_cast<size_t>(bytes),
                                        stream_));
}

void CudaEngine::upload(TensorRole role) {
  for (const TensorSpec* t : program_.with_role(role))
    if (!released(*t)) copy_up(t->offset, host(*t), t->bytes);
  synchronize();
}

void CudaEngine::download(TensorRole role) {
  for (const TensorSpec* t : program_.with_role(role))
    if (!released(*t)) copy_down(host(*t), t->offset, t->bytes);
  synchronize();
}

void CudaEngine::download_tensor(const TensorSpec& t) {
  if (!released(t)) copy_down(host(t), t.offset, t.bytes);
  synchronize();
}

void CudaEngine::release(const std::vector<const TensorSpec*>& tensors) {
  // Nothing may still be reading or writing what is unmapped (the arena's zero fill, a checkpoint's copies).
  NAPKIN_CU(*driver_, cuStreamSynchronize(stream_));
  if (comm_stream_) NAPKIN_CU(*driver_, cuStreamSynchronize(comm_stream_));
  for (const TensorSpec* t : tensors) {
    released_.insert(t->name);
    arena_memory_->release(t->offset, t->bytes);
  }
}

std::optional<DeviceArenaMemory> CudaEngine::device_arena_memory() const {
  const DeviceArena& a = *arena_memory_;
  return DeviceArenaMemory{a.reserved_bytes(), a.mapped_bytes(), a.peak_mapped_bytes(),
                           a.virtual_memory() ? a.granularity() : 0, a.why_not_virtual()};
}

void CudaEngine::run_forward() {
  for (TensorRole role : {TensorRole::Input, TensorRole::Rng})
    for (const TensorSpec* t : program_.with_role(role)) copy_up(t->offset, host(*t), t->bytes);
  run_phase(forward_);
}

void CudaEngine::run_setup() { run_phase(setup_); }

void CudaEngine::run_decode() {
  for (const TensorSpec* t : program_.with_role(TensorRole::Input)) copy_up(t->offset, host(*t), t->bytes);
  run_phase(decode_);
}

double CudaEngine::loss() {
  const TensorSpec& l = program_.loss();
  char* h = host(l);
  copy_down(h, l.offset, l.bytes);
  synchronize();
  return read_element(h, l.dtype, 0);
}

void CudaEngine::run_backward() {
  if (segments_.empty()) {  // no gradients averaged here
    run_phase(backward_);
    // ZeRO-3: the others' gradients' bytes may have held the step's temporaries (the memory plan shares them)
    for (int i : others_gradients_) {
      const GradientSpec& g = program_.gradients[static_cast<size_t>(i)];
      NAPKIN_CU(*driver_, cuMemsetD8Async(arena_ + static_cast<CUdeviceptr>(g.offset), 0, static_cast<size_t>(g.bytes),
                                          stream_));
    }
    return;
  }
  CudaDriver& d = *driver_;
  for (size_t s = 0; s < segments_.size(); ++s) {
    run_phase(segments_[s]);
    NAPKIN_CU(d, cuEventRecord(segment_done_[s], stream_));
    NAPKIN_CU(d, cuStreamWaitEvent(comm_stream_, segment_done_[s], 0));
    nccl_->average_gradients(program_, buckets_[s], gradient_owner_, arena_, comm_stream_);
    if (!gradient_owner_.empty())  // ZeRO-2: the others' gradients add nothing to this rank's part of the norm
      for (int i : buckets_[s])
        if (const GradientSpec& g = program_.gradients[static_cast<size_t>(i)]; gradient_owner_[static_cast<size_t>(i)] != rank_)
          NAPKIN_CU(d, cuMemsetD8Async(arena_ + static_cast<CUdeviceptr>(g.offset), 0, static_cast<size_t>(g.bytes),
                                       comm_stream_));
  }
  NAPKIN_CU(d, cuEventRecord(comm_done_, comm_stream_));
  NAPKIN_CU(d, cuStreamWaitEvent(stream_, comm_done_, 0));  // the optimizer reads the averages
}

void CudaEngine::run_optimizer() { run_phase(optimizer_); }

void CudaEngine::download_gradients(char* dst) {
  for (const GradientSpec& g : program_.gradients) {
    copy_down(dst, g.offset, g.bytes);
    dst += g.bytes;
  }
  synchronize();
}

bool CudaEngine::open_nccl(Communicator& comm, std::string& why) {
  why.clear();
  if (nccl_) return true;
  // Every rank takes the same path: NCCL only if every rank can load it.
  std::unique_ptr<NcclCollectives> nccl;
  if (const char* off = std::getenv("NAPKIN_NCCL"); off && std::string_view(off) == "0") {
    why = "NAPKIN_NCCL=0";
  } else {
    try {
      nccl = std::make_unique<NcclCollectives>();
    } catch (const Error& e) {
      why = e.what();
    }
  }
  double able = nccl ? 1 : 0;
  comm.all_reduce_sum(&able, 1);
  if (able < comm.size()) {
    if (why.empty())
      why = fmt::format("{} of {} ranks cannot use NCCL", comm.size() - static_cast<int>(able), comm.size());
    return false;
  }
  nccl->join(comm);
  nccl_ = std::move(nccl);
  rank_ = comm.rank();
  return true;
}

std::string CudaEngine::run_collectives_on_device(Communicator& comm, std::function<int(const std::string& param)> owner,
                                                  int stage, std::string& why) {
  if (!open_nccl(comm, why)) return "";
  owner_ = std::move(owner);
  collective_stage_ = stage;
  return nccl_->describe();
}

bool CudaEngine::broadcast_params_on_device(const std::function<int(const std::string& param)>& owner) {
  if (!nccl_) return false;
  const std::vector<const TensorSpec*> params = program_.with_role(TensorRole::Param);
  std::vector<int> owners;
  for (const TensorSpec* t : params) owners.push_back(owner(t->name));
  nccl_->broadcast(params, owners, arena_, stream_);
  return true;
}

std::string CudaEngine::join_device_collectives(Communicator& comm, std::string& why) {
  if (!open_nccl(comm, why)) return "";
  if (owner_ && collective_stage_ == 3) {
    average_reduces_ = true;
    for (size_t i = 0; i < program_.gradients.size(); ++i)
      if (owner_(program_.gradients[i].param) != rank_) others_gradients_.push_back(static_cast<int>(i));
    return nccl_->describe() + " in the step, each gradient averaged onto its owner";
  }
  if (owner_ && collective_stage_ == 2)
    for (const GradientSpec& g : program_.gradients) gradient_owner_.push_back(owner_(g.param));
  const char* overlap = std::getenv("NAPKIN_CUDA_OVERLAP");
  plan_buckets(!(overlap && std::string_view(overlap) == "0"));
  NAPKIN_CU(*driver_, cuStreamCreate(&comm_stream_, CU_STREAM_NON_BLOCKING));
  for (size_t i = 0; i < segments_.size(); ++i) {
    CUevent e = nullptr;
    NAPKIN_CU(*driver_, cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    segment_done_.push_back(e);
  }
  NAPKIN_CU(*driver_, cuEventCreate(&comm_done_, CU_EVENT_DISABLE_TIMING));
  const std::string onto = gradient_owner_.empty() ? "" : " onto each gradient's owner";
  if (segments_.size() == 1)
    return nccl_->describe() + onto + " on the GPU after the backward (not overlapped with it)";
  return fmt::format("{}{} on the GPU in {} buckets, each as soon as the backward has written it (overlapped with the "
                     "rest of the backward)",
                     nccl_->describe(), onto, segments_.size());
}

void CudaEngine::plan_buckets(bool overlap) {
  const int first = program_.num_forward_kernels, last = program_.num_gradient_kernels;
  std::vector<int> order(program_.gradients.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return program_.gradients[static_cast<size_t>(a)].ready_after < program_.gradients[static_cast<size_t>(b)].ready_after;
  });
  std::vector<int> bucket;
  double filling = 0;
  int start = first;
  for (size_t n = 0; n < order.size(); ++n) {
    const GradientSpec& g = program_.gradients[static_cast<size_t>(order[n])];
    bucket.push_back(order[n]);
    filling += static_cast<double>(g.bytes);
    const bool full = overlap && filling >= program_.bucket_bytes;
    if (!full && n + 1 < order.size()) continue;
    // The segment ends after the kernel that finishes the bucket's last gradient; the last one at the backward's end.
    const int end = n + 1 == order.size() ? last : std::clamp(g.ready_after + 1, start, last);
    segments_.push_back({start, end, false});
    buckets_.push_back(std::move(bucket));
    bucket.clear();
    filling = 0;
    start = end;
  }
}

void CudaEngine::average_gradients_on_device() {
  // Enqueued by run_backward; waited for here, under the watchdog: a dead
  // peer leaves NCCL spinning.
  Communicator::Waiting waiting("NCCL's all-reduce");
  synchronize();
}

void CudaEngine::upload_gradients(const char* src) {
  for (const GradientSpec& g : program_.gradients) {
    copy_up(g.offset, src, g.bytes);
    src += g.bytes;
  }
  synchronize();
}

void CudaEngine::download_gradient(size_t index, char* dst) {
  const GradientSpec& g = program_.gradients.at(index);
  copy_down(dst, g.offset, g.bytes);
  synchronize();
}

void CudaEngine::upload_gradient(size_t index, const char* src) {
  const GradientSpec& g = program_.gradients.at(index);
  copy_up(g.offset, src, g.bytes);
  synchronize();
}

void CudaEngine::zero_gradient(size_t index) {
  const GradientSpec& g = program_.gradients.at(index);
  NAPKIN_CU(*driver_, cuMemsetD8Async(arena_ + static_cast<CUdeviceptr>(g.offset), 0, static_cast<size_t>(g.bytes), stream_));
  synchronize();
}

void CudaEngine::inspect_each_kernel(std::function<void(int kernel, const char* output)> inspect) {
  if (!inspect_host_) {
    size_t bytes = 1;
    for (const KernelSpec& k : program_.kernels)
      bytes = std::max(bytes, static_cast<size_t>(k.out_numel * element_bytes(k.out_dtype)));
    void* p = nullptr;
    NAPKIN_CU(*driver_, cuMemHostAlloc(&p, bytes, 0));
    inspect_host_ = static_cast<char*>(p);
  }
  inspect_ = std::move(inspect);
}

void CudaEngine::run_phase(Phase& phase) {
  arena_memory_->back(stream_);
  if (inspect_ || profiling_) {
    for (int i = phase.first; i < phase.last; ++i)
      if (!skipped(i)) run_kernel_alone(i);
    if (phase.updates) enqueue_updates();
    return;
  }
  bool empty = phase.first == phase.last && (!phase.updates || program_.updates.empty());
  if (!graphs_enabled_ || empty || phase.eager_runs == 0) {
    ++phase.eager_runs;
    enqueue_phase(phase);
    return;
  }
  if (!phase.graph) capture(phase);
  NAPKIN_CU(*driver_, cuGraphLaunch(phase.graph, stream_));
}

void CudaEngine::enqueue_phase(const Phase& phase) {
  for (int i = phase.first; i < phase.last; ++i)
    if (!skipped(i)) enqueue_kernel(i);
  if (phase.updates) enqueue_updates();
}

void CudaEngine::enqueue_updates() {
  for (size_t i = 0; i < program_.updates.size(); ++i) {
    const UpdateSpec& u = program_.updates[i];
    if (u.from == u.to || u.bytes == 0 || (!skip_update_.empty() && skip_update_[i])) continue;
    NAPKIN_CU(*driver_, cuMemcpyDtoDAsync(arena_ + static_cast<CUdeviceptr>(u.to),
                                          arena_ + static_cast<CUdeviceptr>(u.from), static_cast<size_t>(u.bytes),
                                          stream_));
  }
}

void CudaEngine::capture(Phase& phase) {
  CudaDriver& d = *driver_;
  NAPKIN_CU(d, cuStreamSynchronize(stream_));  // the eager run is done with everything it loaded
  // NCCL's own threads may call CUDA while a segment is captured: only this
  // thread's calls are the capture's business then.
  NAPKIN_CU(d, cuStreamBeginCapture(stream_, nccl_ ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL : CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUgraph graph = nullptr;
  try {
    enqueue_phase(phase);
  } catch (...) {
    // End the capture, or the stream stays unusable for the error's report.
    if (d.cuStreamEndCapture(stream_, &graph) == CUDA_SUCCESS && graph) d.cuGraphDestroy(graph);
    throw;
  }
  NAPKIN_CU(d, cuStreamEndCapture(stream_, &graph));
  CUresult r = d.cuGraphInstantiate(&phase.graph, graph, 0);
  d.cuGraphDestroy(graph);  // the executable graph does not need it
  check_call(d, r, "cuGraphInstantiate", __FILE__, __LINE__);
}

void CudaEngine::set_collectives(std::function<void(const CollectiveSpec&, const char*, char*)> fn) {
  // Each collective runs on the host between two kernels: no graph can hold that.
  collectives_ = std::move(fn);
  graphs_enabled_ = false;
}

void CudaEngine::run_collective_on_host(const CollectiveSpec& c) {
  CudaDriver& d = *driver_;
  const size_t bytes = static_cast<size_t>(c.count * element_bytes(c.dtype));
  collective_host_.resize(bytes);
  char* host = collective_host_.data();
  NAPKIN_CU(d, cuMemcpyDtoHAsync(host, arena_ + static_cast<CUdeviceptr>(c.x), bytes, stream_));
  synchronize();  // x is written, and down
  collectives_(c, host, host);
  NAPKIN_CU(d, cuMemcpyHtoDAsync(arena_ + static_cast<CUdeviceptr>(c.y), host, bytes, stream_));
  synchronize();  // the host buffer is read before the next collective reuses it
}

void CudaEngine::enqueue_kernel(int i) {
  if (const CollectiveSpec* c = program_.kernels[static_cast<size_t>(i)].as<CollectiveSpec>()) {
    if (collectives_) {
      run_collective_on_host(*c);
      return;
    }
    if (runs_on_nccl(*c)) {
      nccl_->collective(*c, c->param.empty() ? 0 : owner_(c->param), arena_ + static_cast<CUdeviceptr>(c->x),
                        arena_ + static_cast<CUdeviceptr>(c->y), stream_, average_reduces_);
      return;
    }
  }
  auto launch = [&](Launch& l) {
    std::array<void*, 3> params = kernel_params(arena_, scratch_, l.offsets);
    try {
      NAPKIN_CU(*driver_, cuLaunchKernel(l.function, l.grid, 1, 1, l.block, 1, 1, l.shared_bytes, stream_,
                                         params.data(), nullptr));
    } catch (const Error& e) {  // name the kernel (an error of an earlier one may surface here too)
      throw Error(fmt::format("kernel {} ({}): {}", program_.kernels[static_cast<size_t>(i)].name,
                              program_.kernels[static_cast<size_t>(i)].where, e.what()));
    }
  };
  std::visit(overloaded{
                 [&](Launches& launches) {
                   for (Launch& l : launches) launch(l);
                 },
                 [&](std::unique_ptr<LtMatmul>& matmul) { matmul->enqueue(stream_); },
                 [&](ClassifierRunner& c) {  // its GEMMs between its launches
                   c.gemms->enqueue(stream_, [&](int j) { launch(c.launches[static_cast<size_t>(j)]); });
                 },
             },
             runners_[static_cast<size_t>(i)]);
}

void CudaEngine::run_kernel_alone(int i) {
  CudaDriver& d = *driver_;
  if (profiling_) NAPKIN_CU(d, cuEventRecord(kernel_start_, stream_));
  enqueue_kernel(i);
  if (profiling_) NAPKIN_CU(d, cuEventRecord(kernel_end_, stream_));
  synchronize();
  if (profiling_) {
    float ms = 0;
    NAPKIN_CU(d, cuEventElapsedTime(&ms, kernel_start_, kernel_end_));
    kernel_seconds_[i] += ms / 1e3;
  }
  if (inspect_) {
    const KernelSpec& k = program_.kernels[i];
    size_t bytes = static_cast<size_t>(k.out_numel * element_bytes(k.out_dtype));
    if (bytes > 0) {
      NAPKIN_CU(d, cuMemcpyDtoHAsync(inspect_host_, arena_ + static_cast<CUdeviceptr>(k.out_offset), bytes, stream_));
      NAPKIN_CU(d, cuStreamSynchronize(stream_));
    }
    inspect_(i, inspect_host_);
  }
}

void CudaEngine::skip(const std::vector<bool>& kernels, const std::vector<bool>& updates,
                      const std::vector<std::vector<bool>>& members) {
  skip_kernel_ = kernels;
  skip_update_ = updates;
  CudaDriver& d = *driver_;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].empty()) continue;
    const std::string global = program_.kernels[i].name + "_run";
    CUdeviceptr mask = 0;
    size_t bytes = 0;
    NAPKIN_CU(d, cuModuleGetGlobal(&mask, &bytes, module_, global.c_str()));
    if (bytes != members[i].size())
      throw Error(fmt::format("the module's {} has {} bytes for {} members", global, bytes, members[i].size()));
    // On the stream, before any step (or graph) runs the kernel.
    std::vector<unsigned char> run(members[i].begin(), members[i].end());
    NAPKIN_CU(d, cuMemcpyHtoDAsync(mask, run.data(), run.size(), stream_));
    NAPKIN_CU(d, cuStreamSynchronize(stream_));  // `run` is freed on return
  }
}

void CudaEngine::synchronize() {
  // ZeRO-2 and 3: the step's NCCL calls are in the stream, and a dead peer leaves them spinning: the watchdog
  // times the wait.
  std::optional<Communicator::Waiting> waiting;
  if (owner_) waiting.emplace("the step's NCCL collectives");
  if (bad_index_)
    NAPKIN_CU(*driver_, cuMemcpyDtoHAsync(bad_index_host_, bad_index_, 3 * sizeof(long long), stream_));
  NAPKIN_CU(*driver_, cuStreamSynchronize(stream_));
  if (!bad_index_ || bad_index_host_[0] < 0) return;
  throw Error(bad_index_message(program_, bad_index_host_[0], bad_index_host_[1], bad_index_host_[2]));
}

}  // namespace napkin::runtime::cuda
