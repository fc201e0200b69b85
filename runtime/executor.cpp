#include "runtime/executor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "runtime/error.h"
#include "runtime/pages.h"
#include "runtime/routing.h"

namespace napkin::runtime {

namespace {

const Program* g_active = nullptr;

struct LoopCall {
  KernelFn fn;
  char* arena;
  const int64_t* offsets;
  int64_t base = 0;  // added to the range: a batch member's first work item
};

// A GEMM epilogue's generated function (codegen/cpu/kernels.cpp): rows
// [begin, end) of D from their f32 sums, row `begin` first, n floats a row.
using EpilogueFn = void (*)(char* arena, int64_t begin, int64_t end, const float* sums, const int64_t* offsets);
struct EpilogueCall {
  EpilogueFn fn;
  char* arena;
  const int64_t* offsets;
};

void run_chunk(void* ctx, int64_t begin, int64_t end) {
  auto* call = static_cast<LoopCall*>(ctx);
  call->fn(call->arena, call->base + begin, call->base + end, call->offsets);
}

}  // namespace

const Program* active_program() { return g_active; }

Executor::Executor(const Program& program, const KernelCode* code, int threads)
    : program_(program), code_(code), pool_(threads) {
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
  prepare();
  kernel_seconds.assign(program.kernels.size(), 0.0);
  g_active = &program_;
}

Executor::~Executor() {
  if (g_active == &program_) g_active = nullptr;
  ::munmap(arena_, arena_mapped_);
}

void Executor::release(int64_t offset, int64_t bytes) {
  const auto [begin, end] = whole_pages(offset, bytes);
  if (end <= begin) return;
  // Small pages there first: a huge page around it would back it again.
  ::madvise(arena_ + begin, static_cast<size_t>(end - begin), MADV_NOHUGEPAGE);
  ::madvise(arena_ + begin, static_cast<size_t>(end - begin), MADV_DONTNEED);
}

void Executor::zero(int64_t offset, int64_t bytes) {
  const PageRange whole = whole_pages(offset, bytes);
  const int64_t begin = std::min(offset + bytes, whole.begin), end = std::max(begin, whole.end);
  std::memset(arena_ + offset, 0, static_cast<size_t>(begin - offset));
  std::memset(arena_ + end, 0, static_cast<size_t>(offset + bytes - end));
  release(begin, end - begin);
}

void Executor::prepare() {
  for (const KernelSpec& k : program_.kernels) {
    try {
      runners_.push_back(std::visit(
          overloaded{
              [](const LoopSpec&) -> Runner { return std::monostate(); },
              [&](const MatmulSpec& s) -> Runner {
                if (s.a_dtype != s.b_dtype)
                  throw Error("no CPU matmul of " + std::string(dtype_name(s.a_dtype)) + " by " +
                              std::string(dtype_name(s.b_dtype)));
                auto gemm = std::make_unique<Gemm>(s.desc, GemmTypes{gemm_type(s.a_dtype), gemm_type(s.c_dtype)},
                                                   LowPrecisionKernel::Auto, s.epilogue.has_value());
                // oneDNN primitives (bf16) are created now, not in the first step.
                gemm->prepare(pool_.num_threads());
                return gemm;
              },
              [](const AttentionSpec& s) -> Runner { return std::make_unique<Attention>(s.desc, gemm_type(s.dtype)); },
              [](const CachedAttentionSpec& s) -> Runner {
                return std::make_unique<CachedAttention>(s.desc, gemm_type(s.dtype));
              },
              [](const ClassifierSpec& s) -> Runner { return std::make_unique<Classifier>(s.desc, gemm_type(s.dtype)); },
              // Its table of cos and sin is made here, once.
              [](const RopeSpec& s) -> Runner { return std::make_unique<RopeKernel>(s.desc, s.dtype); },
              [](const CollectiveSpec&) -> Runner { return std::monostate(); },
              [](const TopKSpec& s) -> Runner {
                check_top_k(s.desc, s.dtype);
                return std::monostate();
              },
              [](const MoeSlotsSpec& s) -> Runner {
                check_moe_slots(s.desc);
                return std::monostate();
              },
          },
          k.payload));
    } catch (const Error& e) {
      throw Error("kernel " + k.name + ": " + e.what());
    }
  }
}

void Executor::run_kernel(int i) {
  char* m = arena_;
  const KernelSpec& k = program_.kernels[i];
  Runner& runner = runners_[static_cast<size_t>(i)];
  try {
    std::visit(
        overloaded{
            [&](const LoopSpec& s) { run_loop(i, s); },
            [&](const MatmulSpec& s) {
              Gemm& gemm = *std::get<std::unique_ptr<Gemm>>(runner);
              if (s.epilogue) {
                // The kernel's generated function is its epilogue: rows [r0, r1) of D from their sums.
                EpilogueCall call{reinterpret_cast<EpilogueFn>(code_[i].fn), m, code_[i].offsets};
                RowsEpilogue epilogue{[](void* ctx, int64_t r0, int64_t r1, const float* sums) {
                                        auto* c = static_cast<EpilogueCall*>(ctx);
                                        c->fn(c->arena, r0, r1, sums, c->offsets);
                                      },
                                      &call};
                gemm.run_with_epilogue(m + s.a, m + s.b, epilogue, pool_);
                return;
              }
              gemm.run(static_cast<const void*>(m + s.a), static_cast<const void*>(m + s.b),
                       static_cast<void*>(m + s.c), pool_);
              // The weight gradient's bias gradient: B summed over k while it is still in cache.
              if (s.bias_grad >= 0)
                sum_b_over_k(s.desc, gemm_type(s.b_dtype), m + s.b, reinterpret_cast<float*>(m + s.bias_grad), pool_);
            },
            [&](const AttentionSpec& a) {
              const Attention& attention = *std::get<std::unique_ptr<Attention>>(runner);
              if (a.backward)
                attention.backward(m + a.q, m + a.k, m + a.v, m + a.o, reinterpret_cast<const float*>(m + a.lse),
                                   m + a.d_o, m + a.dq, m + a.dk, m + a.dv, pool_);
              else
                attention.forward(m + a.q, m + a.k, m + a.v, m + a.o, reinterpret_cast<float*>(m + a.lse), pool_);
            },
            [&](const CachedAttentionSpec& a) {
              std::get<std::unique_ptr<CachedAttention>>(runner)->run(m + a.q, m + a.k, m + a.v, m + a.k_cache,
                                                                      m + a.v_cache, m + a.positions, m + a.o, pool_);
            },
            [&](const ClassifierSpec& c) {
              const Classifier& classifier = *std::get<std::unique_ptr<Classifier>>(runner);
              if (c.backward)
                classifier.backward(m + c.x, m + c.w, m + c.targets, m + c.lse, m + c.dloss, m + c.dx, m + c.dw, pool_);
              else
                classifier.forward(m + c.x, m + c.w, m + c.targets, m + c.loss, m + c.lse, pool_);
            },
            [&](const RopeSpec& r) {
              std::get<std::unique_ptr<RopeKernel>>(runner)->run(m + r.x, r.positions >= 0 ? m + r.positions : nullptr,
                                                                m + r.y, pool_);
            },
            [&](const TopKSpec& t) {
              top_k(t.desc, t.dtype, m + t.x, m + t.values, reinterpret_cast<int32_t*>(m + t.indices), pool_);
            },
            [&](const MoeSlotsSpec& s) {
              const std::optional<int64_t> bad =
                  moe_slots(s.desc, reinterpret_cast<const int32_t*>(m + s.indices), reinterpret_cast<int32_t*>(m + s.pos),
                            reinterpret_cast<int32_t*>(m + s.src), reinterpret_cast<float*>(m + s.counts));
              if (bad) napkin_rt_bad_index(i, *bad, s.desc.experts);  // as an embedding's generated code does
            },
            [&](const CollectiveSpec& c) {
              if (collectives) collectives(c, m + c.x, m + c.y);
              else std::memmove(m + c.y, m + c.x, static_cast<size_t>(c.count * element_bytes(c.dtype)));
            },
        },
        k.payload);
  } catch (const Error& e) {
    throw Error("kernel " + k.name + " (" + k.where + "): " + e.what());
  }
}

void Executor::run_loop(int i, const LoopSpec& s) {
  LoopCall call{code_[i].fn, arena_, code_[i].offsets};
  if (!run_member.empty() && !run_member[static_cast<size_t>(i)].empty()) {
    // Some members of a batch only (ZeRO-1): each one's work items.
    const std::vector<bool>& run = run_member[static_cast<size_t>(i)];
    for (size_t m = 0; m < s.members.size(); ++m) {
      const int64_t work = s.members[m].work;
      if (run[m]) {
        if (s.parallel) pool_.parallel_for(work, run_chunk, &call);
        else call.fn(arena_, call.base, call.base + work, call.offsets);
      }
      call.base += work;
    }
  } else if (s.parallel) {
    pool_.parallel_for(s.extent, run_chunk, &call);
  } else {
    call.fn(arena_, 0, s.extent, call.offsets);
  }
  if (s.combine) call.fn(arena_, s.extent, s.extent + 1, call.offsets);
}

void Executor::run_kernels(int first, int last) {
  g_active = &program_;
  for (int i = first; i < last; ++i) {
    if (wait_collectives) wait_collectives(i);
    // Never a collective: the other ranks would wait in it for this one.
    if (!skip_kernel.empty() && skip_kernel[static_cast<size_t>(i)] && !program_.kernels[i].as<CollectiveSpec>()) continue;
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
  if (wait_collectives) wait_collectives(-1);  // nothing in flight once the kernels return
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
