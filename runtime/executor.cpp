#include "runtime/executor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/error.h"

namespace napkin::runtime {

namespace {

const Program* g_active = nullptr;

struct LoopCall {
  KernelFn fn;
  char* arena;
  int64_t base = 0;  // added to the range: a batch member's first work item
};

// A GEMM epilogue's generated function (codegen/cpu/kernels.cpp): rows
// [begin, end) of D from their f32 sums, row `begin` first, n floats a row.
using EpilogueFn = void (*)(char* arena, int64_t begin, int64_t end, const float* sums);
struct EpilogueCall {
  EpilogueFn fn;
  char* arena;
};

void run_chunk(void* ctx, int64_t begin, int64_t end) {
  auto* call = static_cast<LoopCall*>(ctx);
  call->fn(call->arena, call->base + begin, call->base + end);
}

}  // namespace

const Program* active_program() { return g_active; }

Executor::Executor(const Program& program, const KernelFn* fns, int threads)
    : program_(program), fns_(fns), pool_(threads) {
  // An anonymous mapping: zero as the plan wants it, page-aligned, and
  // backed only where written, so memory a rank never touches (another
  // rank's optimizer state under ZeRO-1) costs nothing.
  arena_mapped_ = static_cast<size_t>(std::max<int64_t>(program.arena_bytes, 1));
  void* p = ::mmap(nullptr, arena_mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw Error("cannot allocate the arena: " + std::to_string(program.arena_bytes) + " bytes");
  arena_ = static_cast<char*>(p);
  // Huge pages where the kernel has them: the memory-bound sweeps (the
  // optimizer over every parameter and its state, the norms) miss the TLB
  // far less: gpt.yaml bf16-mixed's optimizer kernels 6.7 -> 3.7 ms a step.
  ::madvise(arena_, arena_mapped_, MADV_HUGEPAGE);
  for (const KernelSpec& k : program.kernels) {
    attentions_.push_back(nullptr);
    classifiers_.push_back(nullptr);
    cached_attentions_.push_back(nullptr);
    if (k.is_cached_attention) {
      try {
        cached_attentions_.back() =
            std::make_unique<CachedAttention>(k.cached_attention.desc, gemm_type(k.cached_attention.dtype));
      } catch (const Error& e) {
        throw Error("kernel " + k.name + ": " + e.what());
      }
    }
    if (k.is_classifier) {
      try {
        classifiers_.back() = std::make_unique<Classifier>(k.classifier.desc, gemm_type(k.classifier.dtype));
      } catch (const Error& e) {
        throw Error("kernel " + k.name + ": " + e.what());
      }
    }
    if (k.is_attention) {
      try {
        attentions_.back() = std::make_unique<Attention>(k.attention.desc, gemm_type(k.attention.dtype));
      } catch (const Error& e) {
        throw Error("kernel " + k.name + ": " + e.what());
      }
    }
    if (!k.is_matmul) {
      gemms_.push_back(nullptr);
      continue;
    }
    const MatmulSpec& m = k.matmul;
    if (m.a_dtype != m.b_dtype)
      throw Error("kernel " + k.name + ": no CPU matmul of " + m.a_dtype + " by " + m.b_dtype);
    try {
      gemms_.push_back(std::make_unique<Gemm>(m.desc, GemmTypes{gemm_type(m.a_dtype), gemm_type(m.c_dtype)},
                                              LowPrecisionKernel::Auto, m.epilogue.on));
    } catch (const Error& e) {
      throw Error("kernel " + k.name + ": " + e.what());
    }
    // oneDNN primitives (bf16) are created now, not in the first step.
    gemms_.back()->prepare(pool_.num_threads());
  }
  kernel_seconds.assign(program.kernels.size(), 0.0);
  g_active = &program_;
}

Executor::~Executor() {
  if (g_active == &program_) g_active = nullptr;
  ::munmap(arena_, arena_mapped_);
}

void Executor::release(int64_t offset, int64_t bytes) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t begin = (offset + page - 1) / page * page, end = (offset + bytes) / page * page;
  if (end <= begin) return;
  // Small pages there first: a huge page around it would back it again.
  ::madvise(arena_ + begin, static_cast<size_t>(end - begin), MADV_NOHUGEPAGE);
  ::madvise(arena_ + begin, static_cast<size_t>(end - begin), MADV_DONTNEED);
}

void Executor::run_kernel(int i) {
  const KernelSpec& k = program_.kernels[i];
  if (k.is_matmul && k.matmul.epilogue.on) {
    // The kernel's generated function is its epilogue: rows [r0, r1) of D from their sums.
    const MatmulSpec& m = k.matmul;
    EpilogueCall call{reinterpret_cast<EpilogueFn>(fns_[i]), arena_};
    RowsEpilogue epilogue{[](void* ctx, int64_t r0, int64_t r1, const float* sums) {
                            auto* c = static_cast<EpilogueCall*>(ctx);
                            c->fn(c->arena, r0, r1, sums);
                          },
                          &call};
    gemms_[i]->run_with_epilogue(arena_ + m.a, arena_ + m.b, epilogue, pool_);
    return;
  }
  if (k.is_matmul) {
    const MatmulSpec& m = k.matmul;
    gemms_[i]->run(static_cast<const void*>(arena_ + m.a), static_cast<const void*>(arena_ + m.b),
                   static_cast<void*>(arena_ + m.c), pool_);
    // The weight gradient's bias gradient: B summed over k while it is still in cache.
    if (m.bias_grad >= 0)
      sum_b_over_k(m.desc, gemm_type(m.b_dtype), arena_ + m.b, reinterpret_cast<float*>(arena_ + m.bias_grad), pool_);
    return;
  }
  if (k.is_attention) {
    const AttentionSpec& a = k.attention;
    char* m = arena_;
    if (a.backward)
      attentions_[i]->backward(m + a.q, m + a.k, m + a.v, m + a.o, reinterpret_cast<const float*>(m + a.lse), m + a.d_o,
                               m + a.dq, m + a.dk, m + a.dv, pool_);
    else
      attentions_[i]->forward(m + a.q, m + a.k, m + a.v, m + a.o, reinterpret_cast<float*>(m + a.lse), pool_);
    return;
  }
  if (k.is_cached_attention) {
    const CachedAttentionSpec& a = k.cached_attention;
    char* m = arena_;
    try {
      cached_attentions_[i]->run(m + a.q, m + a.k, m + a.v, m + a.k_cache, m + a.v_cache, m + a.positions, m + a.o, pool_);
    } catch (const Error& e) {
      throw Error("kernel " + k.name + " (" + k.where + "): " + e.what());
    }
    return;
  }
  if (k.is_classifier) {
    const ClassifierSpec& c = k.classifier;
    char* m = arena_;
    try {
      if (c.backward)
        classifiers_[i]->backward(m + c.x, m + c.w, m + c.targets, m + c.lse, m + c.dloss, m + c.dx, m + c.dw, pool_);
      else
        classifiers_[i]->forward(m + c.x, m + c.w, m + c.targets, m + c.loss, m + c.lse, pool_);
    } catch (const Error& e) {
      throw Error("kernel " + k.name + " (" + k.where + "): " + e.what());
    }
    return;
  }
  LoopCall call{fns_[i], arena_};
  if (!run_member.empty() && !run_member[static_cast<size_t>(i)].empty()) {
    // Some members of a batch only (ZeRO-1): each one's work items.
    const std::vector<bool>& run = run_member[static_cast<size_t>(i)];
    for (size_t m = 0; m < k.members.size(); ++m) {
      const int64_t work = k.members[m].work;
      if (run[m]) {
        if (k.parallel) pool_.parallel_for(work, run_chunk, &call);
        else call.fn(arena_, call.base, call.base + work);
      }
      call.base += work;
    }
  } else if (k.parallel) {
    pool_.parallel_for(k.extent, run_chunk, &call);
  } else {
    call.fn(arena_, 0, k.extent);
  }
  if (k.combine) call.fn(arena_, k.extent, k.extent + 1);
}

void Executor::run_kernels(int first, int last) {
  g_active = &program_;
  for (int i = first; i < last; ++i) {
    if (!skip_kernel.empty() && skip_kernel[static_cast<size_t>(i)]) continue;
    if (before_kernel) before_kernel(i);
    if (profile) {
      auto t0 = std::chrono::steady_clock::now();
      run_kernel(i);
      kernel_seconds[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      run_kernel(i);
    }
    if (after_kernel) after_kernel(i);
  }
}

void Executor::apply_updates() {
  for (size_t i = 0; i < program_.updates.size(); ++i) {
    if (!skip_update.empty() && skip_update[i]) continue;
    const UpdateSpec& u = program_.updates[i];
    std::memmove(arena_ + u.to, arena_ + u.from, static_cast<size_t>(u.bytes));
  }
}

double Executor::loss() const {
  const TensorSpec& l = program_.loss();
  return read_element(arena_ + l.offset, l.dtype, 0);
}

}  // namespace napkin::runtime

extern "C" void napkin_rt_bad_index(int64_t kernel, int64_t id, int64_t bound) {
  static const napkin::runtime::Program no_program;  // names the kernel by its index only
  const napkin::runtime::Program* p = napkin::runtime::active_program();
  std::string message = napkin::runtime::bad_index_message(p ? *p : no_program, kernel, id, bound);
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::exit(1);
}
