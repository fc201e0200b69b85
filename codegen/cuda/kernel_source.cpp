// emit_cuda_source: the translation unit of a plan's loop kernels: the
// prelude, then the functions of each distinct loop kernel, in the order of
// their first plan kernel. Each plan kernel is emitted with markers in place
// of its name and operand offsets (codegen/cuda/emit.h), its offsets become
// slots of its `off` parameter, and plan kernels whose text is then the same
// (the layers of a transformer, the optimizer updates of same-shaped
// parameters, ...) share one set of functions, named after the first. Which emitter makes
// each KernelKind is the switch below (no default: -Werror=switch flags a
// new kind); the launch and scratch design of each family is described at the
// top of its file (elementwise.cpp, reductions.cpp, rows.cpp, attention.cpp,
// classifier.cpp, rope.cpp, routing.cpp).
//
// Index ids out of range (embedding, embedding_grad, cross-entropy targets,
// moe_slots' expert indices):
// the CPU backend calls napkin_rt_bad_index and exits. A CUDA kernel records
// the first such id instead, through NAPKIN_BAD_INDEX(kernel index, id, bound),
// into the device global `long long napkin_bad_index[3]` = {kernel, id, bound}
// (element 0 is -1 until then; the first writer wins by atomicCAS), and skips
// the element (writes nothing for it; a cross-entropy row counts 0). The
// runtime reads the global with cuModuleGetGlobal after the step and reports
// it as the CPU does (see the prelude, codegen/cuda/prelude.cpp).
#include "codegen/cuda/kernel_source.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "codegen/cuda/emit.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cuda {

namespace {

using detail::EmittedKernel;

EmittedKernel emit_kernel(const Kernel& k, int index, const CudaClassifierLayout& classifier) {
  if (!k.batch.empty()) return detail::emit_batch(k);
  switch (k.kind) {
    case KernelKind::Fill: return detail::emit_fill(k);
    case KernelKind::Elementwise:
    case KernelKind::FusedElementwise: return detail::emit_elementwise(k);
    case KernelKind::Reduction: return detail::emit_reduction(k);
    case KernelKind::ContractionLoops: return detail::emit_contraction(k);
    case KernelKind::Concat: return detail::emit_concat_or_pad(k);
    case KernelKind::Gather: return detail::emit_embedding(k, index);
    case KernelKind::ScatterAdd: return detail::emit_embedding_grad(k, index);
    case KernelKind::Rows: return detail::emit_rows(k, index);
    case KernelKind::Mse: return detail::emit_mse(k);
    case KernelKind::Attention: return detail::emit_attention(k);
    case KernelKind::Classifier: return detail::emit_classifier(k, index, classifier);
    case KernelKind::CachedAttention: return detail::emit_cached_attention(k, index);
    case KernelKind::Rope: return detail::emit_rope(k);
    case KernelKind::Collective: return detail::emit_collective(k);
    case KernelKind::TopK: return detail::emit_top_k(k);
    case KernelKind::MoeSlots: return detail::emit_moe_slots(k, index);
    case KernelKind::Gemm: break;
  }
  NAPKIN_INTERNAL_CHECK(false, "a GEMM kernel ({}) is cuBLASLt's call, not CUDA C", k.name);
  return {};
}

}  // namespace

namespace {

// A plan kernel's text with its offset markers replaced by slots
// (`off.at[slot]`), slots numbered by first appearance.
struct Parameterized {
  std::string text;              // still holding kSlotCountMarker and kNameMarker
  std::vector<int64_t> offsets;  // per slot: the byte offset
  std::vector<bool> vector;      // per slot: some access is a 16-byte vector access
};

Parameterized parameterize(const std::string& marked) {
  Parameterized p;
  std::unordered_map<int64_t, size_t> slot_of;
  size_t at = 0;
  for (;;) {
    size_t open = marked.find('$', at);
    p.text.append(marked, at, open == std::string::npos ? std::string::npos : open - at);
    if (open == std::string::npos) break;
    size_t close = marked.find('$', open + 1);
    NAPKIN_INTERNAL_CHECK(close != std::string::npos, "an unterminated marker in the CUDA C of a kernel");
    at = close + 1;
    char kind = marked[open + 1];
    if (kind != 'o' && kind != 'v') {  // kSlotCountMarker or kNameMarker
      p.text.append(marked, open, at - open);
      continue;
    }
    int64_t offset = std::stoll(marked.substr(open + 2, close - open - 2));
    auto [slot, fresh] = slot_of.try_emplace(offset, p.offsets.size());
    if (fresh) p.offsets.push_back(offset), p.vector.push_back(false);
    if (kind == 'v') p.vector[slot->second] = true;
    p.text += fmt::format("off.at[{}]", slot->second);
  }
  NAPKIN_INTERNAL_CHECK(!p.offsets.empty(), "a kernel with no operand");
  return p;
}

void replace_all(std::string& text, std::string_view from, std::string_view to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

// One function group: the plan kernels whose parameterized text is the same.
struct Group {
  std::string name;    // its functions' name prefix: the first plan kernel's name
  std::string header;  // the first plan kernel's op and source location
  std::string text;    // with kNameMarker
  std::vector<bool> vector;
  int users = 0;
};

}  // namespace

CudaSource emit_cuda_source(const KernelPlan& plan, const std::string& model_name, const CudaSourceOptions& options) {
  CudaSource src;
  std::vector<Group> groups;
  std::unordered_map<std::string, size_t> group_of;  // parameterized text -> groups index
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const Kernel& k = plan.kernels[i];
    src.classifiers.push_back(k.kind == KernelKind::Classifier ? classifier_layout(k, options) : CudaClassifierLayout{});
    if (k.kind == KernelKind::Gemm) {
      src.launches.emplace_back();
      continue;
    }
    // The emitters name what they make after k.name: emitting a copy named
    // kNameMarker makes the text independent of the name.
    Kernel unnamed = k;
    unnamed.name = detail::kNameMarker;
    EmittedKernel e = emit_kernel(unnamed, static_cast<int>(i), src.classifiers.back());
    Parameterized p = parameterize(e.text);
    replace_all(p.text, detail::kSlotCountMarker, std::to_string(p.offsets.size()));
    auto [it, fresh] = group_of.try_emplace(std::move(p.text), groups.size());
    if (fresh)
      groups.push_back({k.name, fmt::format("{}{}", ir::op_name(k.op), k.where.empty() ? "" : " at " + k.where), it->first,
                        p.vector, 0});
    Group& g = groups[it->second];
    ++g.users;
    // The function assumes 16-byte alignment where its first kernel's
    // offsets allowed vector accesses; this kernel's offsets must allow them
    // too (its own vector accesses are the same, the text being the same).
    for (size_t s = 0; s < p.offsets.size(); ++s)
      NAPKIN_INTERNAL_CHECK(!g.vector[s] || p.offsets[s] % 16 == 0,
                            "kernel {} shares {}'s functions, which load slot {} as 16-byte vectors, at byte offset {}",
                            k.name, g.name, s, p.offsets[s]);
    for (CudaLaunch& l : e.launches) {
      NAPKIN_INTERNAL_CHECK(l.function.rfind(detail::kNameMarker, 0) == 0, "launch of {} in kernel {}", l.function, k.name);
      l.function = g.name + l.function.substr(std::string_view(detail::kNameMarker).size());
      l.offsets = p.offsets;
    }
    src.launches.push_back(std::move(e.launches));
    src.scratch_bytes = std::max(src.scratch_bytes, e.scratch_bytes);
  }
  src.text = fmt::format("// napkin: CUDA kernels of model {} ({} plan kernels, {} distinct loop kernels)\n", model_name,
                         plan.kernels.size(), groups.size());
  src.text += cuda_prelude();
  for (Group& g : groups) {
    src.text += fmt::format("\n// {}: {}", g.name, g.header);
    if (g.users > 1) src.text += fmt::format(" (the same code for {} more plan kernels)", g.users - 1);
    src.text += '\n';
    replace_all(g.text, detail::kNameMarker, g.name);
    NAPKIN_INTERNAL_CHECK(g.text.find('$') == std::string::npos, "a marker left in the CUDA C of {}", g.name);
    src.text += g.text;
  }
  return src;
}

}  // namespace napkin::codegen::cuda
