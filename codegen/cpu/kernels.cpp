#include "codegen/cpu/kernels.h"

#include <fmt/format.h>
#include <llvm/IR/Intrinsics.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include "codegen/cpu/scalar_ops.h"
#include "ir/internal_check.h"

namespace napkin::codegen::cpu {

namespace {

using ir::Op;
using Idx = std::vector<llvm::Value*>;

// Below this many elements of work a kernel runs on one thread: waking the
// other costs more than it saves (~2 us against ~1 ns per element).
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t s : v) n *= s;
  return n;
}

LoopInfo loop_info(int64_t extent, int64_t work, bool splittable = true) {
  return {extent, splittable && extent > 1 && work >= kParallelMinElements};
}

// ---------------------------------------------------------------- elementwise

// The position of the element at `idx` of a loop over `sizes` (see ElementAt).
ElementAt element_at(LoopEmitter& e, const Idx& idx, const std::vector<int64_t>& sizes, bool row_col, bool flat) {
  ElementAt at;
  if (row_col) at.row = idx[idx.size() - 2], at.col = idx.back();
  if (flat) {
    std::vector<int64_t> dense(sizes.size(), 1);
    for (int d = static_cast<int>(sizes.size()) - 2; d >= 0; --d) dense[d] = dense[d + 1] * sizes[d + 1];
    at.flat = e.dot(idx, dense);
  }
  return at;
}

// Side of the square tiles nest_tiled walks.
constexpr int64_t kTransposeTile = 32;

// A loop nest over `sizes` whose dim 0 runs over [begin, end), as
// LoopEmitter::nest(sizes, 0, body) does, but when some operand walks the
// last two dims transposed (its stride along the last dim is more than one
// element and more than along the one before), those two dims run in square
// tiles: the operand's cache lines, one per row of the tile, are reused by
// the tile's next elements instead of being evicted by a whole row's worth
// of others (a bf16 [vocab, d] gradient cast into a [d, vocab] parameter's
// layout ran 30x slower than its bytes).
void nest_tiled(LoopEmitter& e, const std::vector<int64_t>& sizes, const std::vector<const std::vector<int64_t>*>& strides,
                const std::function<void(const Idx&)>& body) {
  const size_t rank = sizes.size();
  bool transposed = false;
  for (const std::vector<int64_t>* s : strides)
    if (rank >= 2 && s->size() == rank) {
      const int64_t last = std::abs((*s)[rank - 1]), before = std::abs((*s)[rank - 2]);
      transposed = transposed || (last > 1 && last > before);
    }
  if (!transposed || sizes[rank - 1] < 2 * kTransposeTile || sizes[rank - 2] < 2) {
    e.nest(sizes, 0, body);
    return;
  }
  auto& b = e.b;
  // Tiles of one dim over [lo, hi): body(first, last) per tile.
  auto tiles = [&](llvm::Value* lo, llvm::Value* hi, const std::function<void(llvm::Value*, llvm::Value*)>& tile) {
    llvm::Value* count = b.CreateSDiv(b.CreateAdd(b.CreateSub(hi, lo), e.i64(kTransposeTile - 1)), e.i64(kTransposeTile));
    e.loop(e.i64(0), count, [&](llvm::Value* t) {
      llvm::Value* first = b.CreateAdd(lo, b.CreateMul(t, e.i64(kTransposeTile)));
      tile(first, b.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b.CreateAdd(first, e.i64(kTransposeTile)), hi));
    });
  };
  const std::vector<int64_t> outer(sizes.begin(), sizes.end() - 2);
  auto last_two = [&](const Idx& prefix, llvm::Value* lo0, llvm::Value* hi0) {
    tiles(lo0, hi0, [&](llvm::Value* a0, llvm::Value* a1) {
      tiles(e.i64(0), e.i64(sizes[rank - 1]), [&](llvm::Value* c0, llvm::Value* c1) {
        e.loop(a0, a1, [&](llvm::Value* a) {
          e.loop(c0, c1, [&](llvm::Value* c) {
            Idx idx = prefix;
            idx.push_back(a);
            idx.push_back(c);
            body(idx);
          });
        });
      });
    });
  };
  if (outer.empty()) {
    last_two({}, e.begin, e.end);  // dim 0 is the tiled rows: the parallel range
    return;
  }
  e.nest(outer, 0, [&](const Idx& prefix) { last_two(prefix, e.i64(0), e.i64(sizes[rank - 2])); });
}

LoopInfo elementwise(LoopEmitter& e, const Kernel& k) {
  std::vector<int64_t> sizes = k.output.sizes;
  std::vector<int64_t> out_strides = k.output.strides;
  std::vector<std::vector<int64_t>> in_strides;
  for (const Operand& in : k.inputs) in_strides.push_back(broadcast_strides(in, sizes));
  const ir::ElementIndex need = ir::op_info(k.op).element_index;
  if (need != ir::ElementIndex::RowCol) {  // merging dims keeps every element's row-major index
    std::vector<std::vector<int64_t>*> all{&out_strides};
    for (auto& s : in_strides) all.push_back(&s);
    collapse_dims(sizes, all);
  }
  std::vector<const std::vector<int64_t>*> all{&out_strides};
  for (const auto& s : in_strides) all.push_back(&s);
  nest_tiled(e, sizes, all, [&](const Idx& idx) {
    std::vector<llvm::Value*> args;
    for (size_t i = 0; i < k.inputs.size(); ++i) args.push_back(e.load(k.inputs[i], e.dot(idx, in_strides[i])));
    ir::DType from = k.inputs.empty() ? k.output.dtype : k.inputs[0].dtype;
    const ElementAt at = element_at(e, idx, sizes, need == ir::ElementIndex::RowCol, need == ir::ElementIndex::Flat);
    e.store(k.output, e.dot(idx, out_strides), emit_elementwise(e, k.op, k.attrs, from, k.output.dtype, args, at));
  });
  return loop_info(sizes[0], product(sizes));
}

// The results of the fused kernel's first `count` ops at one element, each
// rounded to its IR dtype as storing and loading it would; load(i) gives
// kernel input i's value there (each input is loaded once).
// A GEMM epilogue's contraction (ops[0]) gives `sums`, the element's f32
// sum the GEMM computed.
std::vector<llvm::Value*> fused_ops_at(LoopEmitter& e, const Kernel& k, size_t count,
                                       const std::function<llvm::Value*(int)>& load, const ElementAt& at,
                                       llvm::Value* sums = nullptr) {
  const FusedLoop& f = *k.fused;
  std::vector<llvm::Value*> loaded(k.inputs.size(), nullptr);
  std::vector<llvm::Value*> result;
  for (size_t j = 0; j < count; ++j) {
    const FusedOp& op = f.ops[j];
    if (ir::op_info(op.op).op_class == ir::OpClass::Contraction) {
      NAPKIN_INTERNAL_CHECK(sums && j == 0 && op.dtype == ir::DType::F32, "a contraction inside a loop kernel ({})", k.name);
      result.push_back(sums);
      continue;
    }
    if (op.op == Op::Constant) {
      result.push_back(e.as_stored(e.constant(op.dtype, op.attrs.get_double("value")), op.dtype));
      continue;
    }
    std::vector<llvm::Value*> args;
    std::vector<ir::DType> dtypes;
    for (const FusedArg& a : op.args) {
      if (!a.input) {
        args.push_back(result[a.index]);
        dtypes.push_back(f.ops[a.index].dtype);
        continue;
      }
      if (!loaded[a.index]) loaded[a.index] = load(a.index);
      args.push_back(loaded[a.index]);
      dtypes.push_back(k.inputs[a.index].dtype);
    }
    ir::DType from = dtypes.empty() ? op.dtype : dtypes[0];
    result.push_back(e.as_stored(emit_elementwise(e, op.op, op.attrs, from, op.dtype, args, at), op.dtype));
  }
  return result;
}

// A fused loop kernel (codegen/plan.h): one loop over the iteration shape;
// per element the members run in order on values in registers, and the group
// outputs are stored after every load, so an output written in place of an
// input (the optimizer's state and params) overwrites only its own element.
LoopInfo fused(LoopEmitter& e, const Kernel& k) {
  const FusedLoop& f = *k.fused;
  std::vector<int64_t> sizes = f.shape;
  std::vector<std::vector<int64_t>> in_strides, out_strides;
  for (const Operand& in : k.inputs) in_strides.push_back(broadcast_strides(in, sizes));
  for (const Operand& out : f.outputs) out_strides.push_back(out.strides);
  auto any_needs = [&](ir::ElementIndex need) {
    return std::any_of(f.ops.begin(), f.ops.end(), [&](const FusedOp& op) { return ir::op_info(op.op).element_index == need; });
  };
  const bool needs_row_col = any_needs(ir::ElementIndex::RowCol), needs_flat = any_needs(ir::ElementIndex::Flat);
  if (!needs_row_col) {
    std::vector<std::vector<int64_t>*> all;
    for (auto& s : out_strides) all.push_back(&s);
    for (auto& s : in_strides) all.push_back(&s);
    collapse_dims(sizes, all);
  }
  std::vector<const std::vector<int64_t>*> all;
  for (const auto& s : out_strides) all.push_back(&s);
  for (const auto& s : in_strides) all.push_back(&s);
  nest_tiled(e, sizes, all, [&](const Idx& idx) {
    const ElementAt at = element_at(e, idx, sizes, needs_row_col, needs_flat);
    const std::vector<llvm::Value*> result = fused_ops_at(
        e, k, f.ops.size(), [&](int i) { return e.load(k.inputs[i], e.dot(idx, in_strides[i])); }, at);
    for (size_t o = 0; o < f.outputs.size(); ++o)
      e.store(f.outputs[o], e.dot(idx, out_strides[o]), result[f.output_ops[o]]);
  });
  return loop_info(sizes[0], product(sizes));
}

// A GEMM's epilogue (codegen/plan.h Kernel::epilogue), called by the
// runtime's Gemm on each panel of rows it computed while the panel's sums
// are in cache (runtime/gemm.h RowsEpilogue): D viewed as [rows, n], rows
// [begin, end), the sums from the function's fourth parameter (row `begin`
// first, n floats a row). Per element the epilogue's ops run as a fused
// kernel's do, from the sum instead of a load.
LoopInfo gemm_epilogue(LoopEmitter& e, const Kernel& k) {
  const FusedLoop& f = *k.fused;
  const int64_t n = k.output.sizes.back(), rows = k.output.numel() / std::max<int64_t>(n, 1);
  const std::vector<int64_t> sizes{rows, n};
  // Each operand's strides over [rows, n]: its leading dims' strides merge
  // into one row stride (D, the residual and an aux are contiguous: n; the
  // bias broadcasts: 0). Size-1 dims have no meaningful stride: skipped.
  const std::vector<int64_t>& sizes_d = k.output.sizes;
  auto over_rows = [&](const Operand& o) -> std::vector<int64_t> {
    const std::vector<int64_t> s = broadcast_strides(o, sizes_d);
    const size_t r = s.size();
    int64_t row = -1, below = 1;  // the row stride, and the rows of the dims inside the one looked at
    for (size_t d = r - 1; d-- > 0;) {
      if (sizes_d[d] > 1) {
        if (row < 0) row = below == 1 ? s[d] : s[d] / below;
        NAPKIN_INTERNAL_CHECK(s[d] == row * below, "a GEMM epilogue operand whose rows are not one stride apart ({})",
                              k.name);
      }
      below *= sizes_d[d];
    }
    return {row < 0 ? 0 : row, s[r - 1]};
  };
  std::vector<std::vector<int64_t>> in_strides(k.inputs.size()), out_strides;
  for (size_t i = 2; i < k.inputs.size(); ++i) in_strides[i] = over_rows(k.inputs[i]);  // A and B are the GEMM's
  for (const Operand& out : f.outputs) out_strides.push_back(over_rows(out));
  llvm::Value* sums = e.fn->getArg(3);
  llvm::Type* f32 = e.b.getFloatTy();
  e.nest(sizes, 0, [&](const Idx& idx) {
    llvm::Value* at_sum = e.b.CreateAdd(e.b.CreateMul(e.b.CreateSub(idx[0], e.begin), e.i64(n)), idx[1]);
    llvm::Value* sum = e.b.CreateLoad(f32, e.b.CreateInBoundsGEP(f32, sums, at_sum));
    const std::vector<llvm::Value*> result = fused_ops_at(
        e, k, f.ops.size(), [&](int i) { return e.load(k.inputs[i], e.dot(idx, in_strides[i])); }, ElementAt{}, sum);
    for (size_t o = 0; o < f.outputs.size(); ++o)
      e.store(f.outputs[o], e.dot(idx, out_strides[o]), result[f.output_ops[o]]);
  });
  return {rows, false};  // the Gemm's panels are the work items
}

// ------------------------------------------------------------------ reductions

// A reduction (sum, mean, max, min) over its axes. Dim 0 of the (collapsed) loop is
// kept, or a size-1 dim is put in front when dim 0 is reduced; each dim-0
// index owns one block of the output: initialize it, accumulate into it,
// finalize it (mean).
// A reduction's accumulator identity and combining step, in out's compute type.
struct Combiner {
  llvm::Value* identity = nullptr;
  std::function<llvm::Value*(llvm::Value*, llvm::Value*)> combine;
};
Combiner combiner_of(LoopEmitter& e, const Kernel& k) {
  const Operand& out = k.output;
  llvm::Type* ct = e.compute_type(out.dtype);
  const bool fp = ct->isFloatingPointTy();
  const ir::Combiner which = k.reduction().combiner;
  Combiner c;
  switch (which) {
    case ir::Combiner::Sum: c.identity = e.constant(out.dtype, 0); break;
    case ir::Combiner::Max:
      c.identity = fp ? e.constant(out.dtype, -std::numeric_limits<double>::infinity())
                      : llvm::ConstantInt::get(ct, llvm::APInt::getSignedMinValue(ct->getIntegerBitWidth()));
      break;
    case ir::Combiner::Min:
      c.identity = fp ? e.constant(out.dtype, std::numeric_limits<double>::infinity())
                      : llvm::ConstantInt::get(ct, llvm::APInt::getSignedMaxValue(ct->getIntegerBitWidth()));
      break;
  }
  c.combine = [&e, fp, which](llvm::Value* acc, llvm::Value* v) -> llvm::Value* {
    switch (which) {
      case ir::Combiner::Sum: break;
      case ir::Combiner::Max: return e.b.CreateBinaryIntrinsic(fp ? llvm::Intrinsic::maximum : llvm::Intrinsic::smax, acc, v);
      case ir::Combiner::Min: return e.b.CreateBinaryIntrinsic(fp ? llvm::Intrinsic::minimum : llvm::Intrinsic::smin, acc, v);
    }
    return e.add_reassoc(acc, v);
  };
  return c;
}

// Partial results a fused reduction keeps per work item: at most this many
// work items split a summed dim 0, and at most this many bytes of partials.
constexpr int64_t kMaxReductionParts = 16;
constexpr int64_t kMaxPartialBytes = int64_t{256} << 10;

// How a summed dim of `extent` indices splits into parts, each summing its
// own partial of `part_bytes`: at most kMaxReductionParts parts and
// kMaxPartialBytes of partials, a number fixed by the shape (never by the
// thread count), every part but the last `per_part` indices long.
struct Parts {
  int64_t count = 1, per_part = 1;
};
Parts split_into_parts(int64_t extent, int64_t part_bytes) {
  Parts p;
  p.count = std::clamp<int64_t>(kMaxPartialBytes / part_bytes, 1, std::min(kMaxReductionParts, extent));
  p.per_part = (extent + p.count - 1) / p.count;
  p.count = (extent + p.per_part - 1) / p.per_part;
  return p;
}

// A kernel with a combining call (Launch::combine): `work` emits the body
// for [begin, end) of its `items` work items, `combine` the body of the
// runtime's last call [items, items + 1), which combines what they left.
void work_then_combine(LoopEmitter& e, int64_t items, const std::function<void()>& work,
                       const std::function<void()>& combine) {
  auto& b = e.b;
  llvm::BasicBlock* work_block = llvm::BasicBlock::Create(e.ctx, "work", e.fn);
  llvm::BasicBlock* combine_block = llvm::BasicBlock::Create(e.ctx, "combine", e.fn);
  llvm::BasicBlock* done = llvm::BasicBlock::Create(e.ctx, "done", e.fn);
  b.CreateCondBr(b.CreateICmpSLT(e.begin, e.i64(items)), work_block, combine_block);
  b.SetInsertPoint(work_block);
  work();
  b.CreateBr(done);
  b.SetInsertPoint(combine_block);
  combine();
  b.CreateBr(done);
  b.SetInsertPoint(done);
}

// A reduction with an elementwise prologue (a fusion group ending in a
// reduction, codegen/plan.h FusedLoop), which may also store prologue
// results. It visits every element of its loop once, in storage order
// (outputs are written where they are computed), and accumulates into
// partial results in the compute type, in a buffer of the module's own:
//  - work item: dim 0 of the collapsed loop. When dim 0 is kept, item i0
//    owns its block of the output, reduced into its block of partials and
//    finished (mean, rounding) there. When dim 0 is summed, it is split into
//    at most kMaxReductionParts parts, a number fixed by the shape (never by
//    the thread count: the bits do not depend on it); each part reduces into
//    its own row of partials, and the runtime's combining call [extent,
//    extent + 1) adds the rows in order into the output (Launch::combine).
//  - where the innermost dim is summed, each run along it is reduced in a
//    register first (a row sum; the whole of a full reduction's part).
LoopInfo fused_reduction(LoopEmitter& e, const Kernel& k) {
  const FusedLoop& f = *k.fused;
  const Operand& out = k.output;
  ReductionLoop loop = reduction_loop(k);
  const std::vector<int64_t>& sizes = loop.sizes;
  const std::vector<int64_t>& out_strides = loop.out_strides;
  const size_t rank = sizes.size();
  const FusedOp& reduce = f.ops.back();
  NAPKIN_INTERNAL_CHECK(!reduce.args.empty(), "fused reduction {} reduces nothing", k.name);
  NAPKIN_INTERNAL_CHECK(out.contiguous(), "fused reduction {} has a strided output", k.name);
  const FusedArg reduced = reduce.args[0];  // a member's result, or a kernel input the members read too
  llvm::Type* ct = e.compute_type(out.dtype);
  const Combiner c = combiner_of(e, k);
  auto& b = e.b;
  const int64_t out_numel = std::max<int64_t>(out.numel(), 1);
  const double count = static_cast<double>(product(f.shape)) / static_cast<double>(out_numel);
  const bool kept0 = out_strides[0] != 0;
  // Work items and the partials each owns (`block` elements from item * block).
  int64_t items = sizes[0], per_item = 1, block = out_numel / sizes[0];
  if (!kept0) {
    const Parts parts = split_into_parts(sizes[0], out_numel * static_cast<int64_t>(ct->getPrimitiveSizeInBits() / 8));
    per_item = parts.per_part;
    items = parts.count;
    block = out_numel;
  }
  NAPKIN_INTERNAL_CHECK(!kept0 || out_strides[0] == block, "fused reduction {}: dim 0 does not own a block of the output", k.name);
  const bool combine = !kept0 && items > 1;
  auto* partial_type = llvm::ArrayType::get(ct, static_cast<uint64_t>(items * block));
  auto* partials = new llvm::GlobalVariable(e.module, partial_type, false, llvm::GlobalValue::InternalLinkage,
                                            llvm::ConstantAggregateZero::get(partial_type), "partials");
  partials->setAlignment(llvm::Align(64));
  auto partial_at = [&](llvm::Value* i) { return b.CreateInBoundsGEP(ct, partials, i); };
  auto finish = [&](llvm::Value* v) {
    return k.reduction().mean ? b.CreateFDiv(v, llvm::ConstantFP::get(ct, count)) : v;
  };
  // The prologue at the loop index idx: its results, the stores made.
  auto visit = [&](const Idx& idx) {
    const std::vector<llvm::Value*> result =
        fused_ops_at(e, k, f.ops.size() - 1, [&](int i) { return e.load(k.inputs[i], e.dot(idx, loop.inputs[i])); }, {});
    for (size_t o = 1; o < f.outputs.size(); ++o)
      e.store(f.outputs[o], e.dot(idx, loop.stores[o - 1]), result[f.output_ops[o]]);
    return reduced.input ? e.load(k.inputs[reduced.index], e.dot(idx, loop.inputs[reduced.index])) : result[reduced.index];
  };

  work_then_combine(
      e, items,
      [&] {
        e.loop(e.begin, e.end, [&](llvm::Value* item) {
          llvm::Value* base = b.CreateMul(item, e.i64(block));  // of its partials
          e.loop(e.i64(0), e.i64(block), [&](llvm::Value* j) { b.CreateStore(c.identity, partial_at(b.CreateAdd(base, j))); });
          llvm::Value* lo = b.CreateMul(item, e.i64(per_item));
          llvm::Value* hi = kept0 ? b.CreateAdd(lo, e.i64(1)) : b.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b.CreateAdd(lo, e.i64(per_item)), e.i64(sizes[0]));
          // The partial of the element at idx: base + its output offset within the item.
          std::vector<int64_t> local(out_strides);
          local[0] = 0;
          auto accumulate = [&](llvm::Value* at, llvm::Value* v) {
            llvm::Value* ptr = partial_at(at);
            b.CreateStore(c.combine(b.CreateLoad(ct, ptr), v), ptr);
          };
          const bool inner_summed = rank > 1 && out_strides.back() == 0;
          if (rank == 1 && !kept0) {  // one summed dim: the part in a register
            llvm::Value* acc = e.make_slot(ct, c.identity);
            e.loop(lo, hi, [&](llvm::Value* i0) { b.CreateStore(c.combine(b.CreateLoad(ct, acc), visit({i0})), acc); });
            accumulate(base, b.CreateLoad(ct, acc));
          } else {
            e.loop(lo, hi, [&](llvm::Value* i0) {
              std::vector<int64_t> outer(sizes.begin() + 1, sizes.end() - (inner_summed ? 1 : 0));
              e.nest(outer, -1, [&](const Idx& rest) {
                Idx idx{i0};
                idx.insert(idx.end(), rest.begin(), rest.end());
                if (!inner_summed) {
                  accumulate(b.CreateAdd(base, e.dot(idx, local)), visit(idx));
                  return;
                }
                llvm::Value* acc = e.make_slot(ct, c.identity);
                e.loop(e.i64(0), e.i64(sizes.back()), [&](llvm::Value* t) {
                  Idx full = idx;
                  full.push_back(t);
                  b.CreateStore(c.combine(b.CreateLoad(ct, acc), visit(full)), acc);
                });
                idx.push_back(e.i64(0));
                accumulate(b.CreateAdd(base, e.dot(idx, local)), b.CreateLoad(ct, acc));
              });
            });
          }
          if (!combine)  // this item's block of the output is complete
            e.loop(e.i64(0), e.i64(block), [&](llvm::Value* j) {
              llvm::Value* at = b.CreateAdd(base, j);
              e.store(out, at, finish(b.CreateLoad(ct, partial_at(at))));
            });
        });
      },
      [&] {
        if (combine)
          e.loop(e.i64(0), e.i64(out_numel), [&](llvm::Value* j) {
            llvm::Value* acc = e.make_slot(ct, c.identity);
            e.loop(e.i64(0), e.i64(items), [&](llvm::Value* p) {
              llvm::Value* at = b.CreateAdd(b.CreateMul(p, e.i64(out_numel)), j);
              b.CreateStore(c.combine(b.CreateLoad(ct, acc), b.CreateLoad(ct, partial_at(at))), acc);
            });
            e.store(out, j, finish(b.CreateLoad(ct, acc)));
          });
      });
  LoopInfo info = loop_info(items, product(sizes));
  info.combine = combine;
  return info;
}

// ------------------------------------------------------------------ batches

// Elements of one member a batch's work item covers.
constexpr int64_t kBatchChunk = int64_t{1} << 15;

// A batch's kernel (codegen/plan.h Kernel::batch): every member is a flat
// loop over its numel elements with the same fused ops, on its own operands.
// The work items are chunks of at most kBatchChunk elements of one member,
// numbered member by member; a work item finds its member in a table of each
// member's first chunk (per member, not per chunk: GPT-2 XL's optimizer has
// 47,624 chunks, whose tables were most of the module's constants); one
// loop serves every member, its operands' byte offsets from a table (one row
// per member, one column per operand: inputs, then outputs), so the code does
// not grow with the members. An output at its input's offset in every member
// (an update written in place) uses that input's column: visibly the same
// address, it vectorizes. A batch of reductions (each member reduces all its
// elements to one value) leaves one partial per chunk in the module's buffer;
// the combining call adds each member's partials in chunk order
// (Launch::combine), so the bits do not depend on the thread count.
LoopInfo batched(LoopEmitter& e, const Kernel& k) {
  const FusedLoop& f = *k.fused;
  auto& b = e.b;
  const bool reduces = k.kind == KernelKind::Reduction;
  const size_t n_in = k.inputs.size(), n_out = f.outputs.size(), width = n_in + n_out;
  // Each member's operands; the first member's dtypes and shapes (0-d or not) are every member's.
  auto operand = [&](size_t m, size_t j) -> const Operand& {
    return j < n_in ? k.batch[m].inputs[j] : k.batch[m].outputs[j - n_in];
  };
  std::vector<int64_t> first_chunk, numel, ends, offsets;
  int64_t chunks = 0;
  for (size_t m = 0; m < k.batch.size(); ++m) {
    const BatchMember& member = k.batch[m];
    NAPKIN_INTERNAL_CHECK(member.inputs.size() == n_in && member.outputs.size() == n_out, "batch {}: member {} has other operands",
                          k.name, m);
    for (size_t j = 0; j < width; ++j) {
      NAPKIN_INTERNAL_CHECK(operand(m, j).dtype == operand(0, j).dtype && operand(m, j).sizes.empty() == operand(0, j).sizes.empty(),
                            "batch {}: member {}'s operand {} differs from member 0's", k.name, m, j);
      offsets.push_back(operand(m, j).byte_offset);
    }
    first_chunk.push_back(chunks);
    numel.push_back(std::max<int64_t>(member.numel, 1));
    ends.push_back(member.numel);
    chunks += (numel.back() + kBatchChunk - 1) / kBatchChunk;
  }
  auto same_offsets = [&](size_t i, size_t j) {
    for (size_t m = 0; m < k.batch.size(); ++m)
      if (operand(m, i).byte_offset != operand(m, j).byte_offset) return false;
    return true;
  };
  std::vector<size_t> column(width);  // of each operand: the first one at its offset in every member
  for (size_t j = 0; j < width; ++j) {
    column[j] = j;
    for (size_t i = 0; i < j && column[j] == j; ++i)
      if (same_offsets(i, j)) column[j] = i;
  }
  first_chunk.push_back(chunks);
  auto table = [&](const std::vector<int64_t>& values, const std::string& name) {
    auto* type = llvm::ArrayType::get(b.getInt64Ty(), values.size());
    std::vector<llvm::Constant*> items;
    for (int64_t v : values) items.push_back(b.getInt64(static_cast<uint64_t>(v)));
    auto* global = new llvm::GlobalVariable(e.module, type, true, llvm::GlobalValue::InternalLinkage,
                                            llvm::ConstantArray::get(type, items), name);
    return [&b, type, global](llvm::Value* i) {
      return b.CreateLoad(b.getInt64Ty(), b.CreateInBoundsGEP(type, global, {b.getInt64(0), i}));
    };
  };
  auto end_of = table(ends, "ends");
  auto first_chunk_of = table(first_chunk, "first_chunk");
  auto numel_of = table(numel, "numel");
  auto offset_of = table(offsets, "offsets");
  // Member m's operand j: the arena at its column's offset.
  auto base = [&](llvm::Value* m, size_t j) {
    return b.CreateInBoundsGEP(b.getInt8Ty(), e.arena, offset_of(b.CreateAdd(b.CreateMul(m, e.i64(width)), e.i64(column[j]))));
  };

  llvm::Type* ct = reduces ? e.compute_type(k.output.dtype) : nullptr;
  llvm::GlobalVariable* partials = nullptr;
  if (reduces) {
    auto* type = llvm::ArrayType::get(ct, static_cast<uint64_t>(chunks));
    partials = new llvm::GlobalVariable(e.module, type, false, llvm::GlobalValue::InternalLinkage,
                                        llvm::ConstantAggregateZero::get(type), "partials");
  }
  auto partial_at = [&](llvm::Value* c) { return b.CreateInBoundsGEP(ct, partials, c); };
  const Combiner c = reduces ? combiner_of(e, k) : Combiner{};
  int reduced = -1;
  if (reduces) {
    const FusedOp& reduce = f.ops.back();
    NAPKIN_INTERNAL_CHECK(!reduce.args.empty() && !reduce.args[0].input, "batch {} reduces no member", k.name);
    reduced = reduce.args[0].index;
  }
  const size_t prologue = reduces ? f.ops.size() - 1 : f.ops.size();

  work_then_combine(
      e, chunks,
      [&] {
        llvm::Value* member = e.make_slot(b.getInt64Ty(), e.i64(0));
        e.loop(e.begin, e.end, [&](llvm::Value* chunk) {
          // The chunk's member: past every member whose chunks end at or before it
          // (first_chunk's last entry, all chunks, ends the walk).
          llvm::Value* from = b.CreateLoad(b.getInt64Ty(), member);
          llvm::BasicBlock* pre = b.GetInsertBlock();
          llvm::BasicBlock* walk = llvm::BasicBlock::Create(e.ctx, "member", e.fn);
          llvm::BasicBlock* found = llvm::BasicBlock::Create(e.ctx, "member.found", e.fn);
          b.CreateBr(walk);
          b.SetInsertPoint(walk);
          llvm::PHINode* m = b.CreatePHI(b.getInt64Ty(), 2, "m");
          m->addIncoming(from, pre);
          llvm::Value* next = b.CreateAdd(m, e.i64(1));
          m->addIncoming(next, walk);
          b.CreateCondBr(b.CreateICmpSLE(first_chunk_of(next), chunk), walk, found);
          b.SetInsertPoint(found);
          b.CreateStore(m, member);
          llvm::Value* lo = b.CreateMul(b.CreateSub(chunk, first_chunk_of(m)), e.i64(kBatchChunk));
          llvm::Value* hi = b.CreateSelect(b.CreateICmpSLT(end_of(m), b.CreateAdd(lo, e.i64(kBatchChunk))), end_of(m),
                                           b.CreateAdd(lo, e.i64(kBatchChunk)));
          std::vector<llvm::Value*> bases(width);
          for (size_t j = 0; j < width; ++j) bases[j] = column[j] == j ? base(m, j) : bases[column[j]];
          llvm::Value* acc = reduces ? e.make_slot(ct, c.identity) : nullptr;
          // A scalar input (the step's learning rate, clipping scale, bias
          // corrections) is loaded once, before the loop: loaded in it, a
          // store to the member's arrays at a run-time index might clobber
          // it as far as LLVM can tell, which keeps the loop scalar. No
          // member writes another's input, and chunks run in parallel.
          std::vector<llvm::Value*> scalar(n_in, nullptr);
          for (size_t in = 0; in < n_in; ++in)
            if (operand(0, in).sizes.empty()) scalar[in] = e.load(operand(0, in), e.i64(0), bases[in]);
          e.loop(lo, hi, [&](llvm::Value* i) {
            auto index = [&](const Operand& o) { return o.sizes.empty() ? e.i64(0) : i; };
            const std::vector<llvm::Value*> result = fused_ops_at(
                e, k, prologue,
                [&](int in) { return scalar[in] ? scalar[in] : e.load(operand(0, in), index(operand(0, in)), bases[in]); }, {});
            for (size_t o = reduces ? 1 : 0; o < n_out; ++o)
              e.store(operand(0, n_in + o), index(operand(0, n_in + o)), result[f.output_ops[o]], bases[n_in + o]);
            if (reduces) b.CreateStore(c.combine(b.CreateLoad(ct, acc), result[reduced]), acc);
          });
          if (reduces) b.CreateStore(b.CreateLoad(ct, acc), partial_at(chunk));
        });
      },
      [&] {
        // The members with the same number of chunks share a loop over
        // them; their partials are summed by an inner loop of that constant
        // length, which LLVM unrolls or vectorizes by it alone (as it did
        // when each member had a loop of its own: the same bits).
        if (!reduces) return;
        std::map<int64_t, std::vector<int64_t>> members_by_chunks;
        for (size_t m = 0; m < k.batch.size(); ++m) members_by_chunks[first_chunk[m + 1] - first_chunk[m]].push_back(int64_t(m));
        for (const auto& by_count : members_by_chunks) {
          const int64_t count = by_count.first;  // not a structured binding: the lambdas capture it
          const std::vector<int64_t>& members = by_count.second;
          auto member_at = table(members, fmt::format("members_of_{}_chunks", count));
          e.loop(e.i64(0), e.i64(static_cast<int64_t>(members.size())), [&](llvm::Value* j) {
            llvm::Value* m = member_at(j);
            llvm::Value* first = first_chunk_of(m);
            llvm::Value* acc = e.make_slot(ct, c.identity);
            e.loop(e.i64(0), e.i64(count), [&](llvm::Value* chunk) {
              b.CreateStore(c.combine(b.CreateLoad(ct, acc), b.CreateLoad(ct, partial_at(b.CreateAdd(first, chunk)))), acc);
            });
            llvm::Value* v = b.CreateLoad(ct, acc);
            if (k.reduction().mean) v = b.CreateFDiv(v, b.CreateSIToFP(numel_of(m), ct));
            e.store(operand(0, n_in), e.i64(0), v, base(m, n_in));
          });
        }
      });
  int64_t work_elements = 0;
  for (const BatchMember& member : k.batch) work_elements += member.numel;
  LoopInfo info = loop_info(chunks, work_elements);
  info.combine = reduces;
  for (size_t m = 0; m < k.batch.size(); ++m) info.member_work.push_back(first_chunk[m + 1] - first_chunk[m]);
  return info;
}

// A reduction: as a fused one whose only op is the reduction of input 0
// (fused_reduction), so every CPU reduction sums in the same order, fused
// or not, and splits a summed dim 0 into parts run in parallel.
LoopInfo reduction(LoopEmitter& e, const Kernel& k) {
  if (k.fused) return fused_reduction(e, k);
  Kernel alone = k;
  FusedLoop f;
  f.shape = k.inputs[0].sizes;
  f.ops.push_back({k.node, k.op, k.attrs, k.output.dtype, {{true, 0}}});
  f.outputs.push_back(k.output);
  f.output_ops.push_back(0);
  alone.fused = std::move(f);
  return fused_reduction(e, alone);
}

// ---------------------------------------------------------------- row kernels

// Row kernels loop as codegen/plan.h's row_loop says. for_each_row runs
// body(bases) for each row in this thread's part of dim 0 (all rows when
// serial: the caller then calls the function with [0, extent)), a base being
// each operand's first element of the row; element k is base + k * step.
void for_each_row(LoopEmitter& e, const std::vector<int64_t>& sizes, const std::vector<RowOperand>& ops,
                  const std::function<void(const std::vector<llvm::Value*>&)>& body) {
  e.nest(sizes, 0, [&](const Idx& idx) {
    std::vector<llvm::Value*> bases;
    for (const RowOperand& r : ops) bases.push_back(e.dot(idx, r.strides));
    body(bases);
  });
}

// Element k of operand r's row starting at base.
llvm::Value* at(LoopEmitter& e, const RowOperand& r, llvm::Value* base, llvm::Value* kk) {
  return r.step == 0 ? base : e.b.CreateAdd(base, e.b.CreateMul(kk, e.i64(r.step)));
}

// sum over the row of f(k), in a vectorizable (reassociable) loop.
llvm::Value* row_sum(LoopEmitter& e, llvm::Type* t, int64_t n, const std::function<llvm::Value*(llvm::Value*)>& f) {
  llvm::Value* acc = e.make_slot(t, llvm::ConstantFP::get(t, 0.0));
  e.loop(e.i64(0), e.i64(n), [&](llvm::Value* kk) { e.b.CreateStore(e.add_reassoc(e.b.CreateLoad(t, acc), f(kk)), acc); });
  return e.b.CreateLoad(t, acc);
}

llvm::Value* row_max(LoopEmitter& e, llvm::Type* t, int64_t n, const std::function<llvm::Value*(llvm::Value*)>& f) {
  llvm::Value* acc = e.make_slot(t, llvm::ConstantFP::get(t, -std::numeric_limits<double>::infinity()));
  e.loop(e.i64(0), e.i64(n), [&](llvm::Value* kk) {
    e.b.CreateStore(e.b.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, e.b.CreateLoad(t, acc), f(kk)), acc);
  });
  return e.b.CreateLoad(t, acc);
}

// Row statistics of layernorm (centered) and rmsnorm: mean (0 when not
// centered) and rstd = 1 / sqrt(mean((x - mean)^2) + eps).
std::pair<llvm::Value*, llvm::Value*> row_stats(LoopEmitter& e, const RowOperand& x, llvm::Value* base, int64_t n,
                                                double eps, bool centered) {
  llvm::Type* t = e.compute_type(x.op->dtype);
  llvm::Value* inv_n = llvm::ConstantFP::get(t, 1.0 / static_cast<double>(n));
  llvm::Value* mean = llvm::ConstantFP::get(t, 0.0);
  if (centered) mean = e.b.CreateFMul(row_sum(e, t, n, [&](llvm::Value* kk) { return e.load(*x.op, at(e, x, base, kk)); }), inv_n);
  llvm::Value* ss = row_sum(e, t, n, [&](llvm::Value* kk) {
    llvm::Value* d = e.b.CreateFSub(e.load(*x.op, at(e, x, base, kk)), mean);
    return e.b.CreateFMul(d, d);
  });
  llvm::Value* var = e.b.CreateFAdd(e.b.CreateFMul(ss, inv_n), llvm::ConstantFP::get(t, eps));
  llvm::Value* rstd = e.b.CreateFDiv(llvm::ConstantFP::get(t, 1.0), e.b.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, var));
  return {mean, rstd};
}

LoopInfo rows(LoopEmitter& e, const Kernel& k, int index) {
  using ir::RowVariant;
  const Operand& x = k.inputs[0];
  const ir::RowParams& p = k.rows();
  const RowLoop rl = row_loop(k);
  const std::vector<RowOperand>& ops = rl.operands;
  bool scalar_out = p.variant == RowVariant::CrossEntropy;
  // A norm's gradient with its gains' sums them over rows into [n] outputs
  // (the gain's, then the bias's, after dx: row_loop), and may add the
  // residual stream's gradient (operand 3) as it stores dx.
  const bool with_gains = p.variant == RowVariant::NormGrad && p.gains;
  const bool vector_out = with_gains;
  const RowOperand& X = ops[0];
  const bool residual = p.variant == RowVariant::NormGrad && k.inputs.size() > 3;
  // The output: the last operand, but for dx with the gains'.
  const size_t out_index = with_gains ? 3 + residual : ops.size() - 1;
  const RowOperand& out = ops[out_index];
  const size_t gain_index = out_index + 1;
  const RowOperand* gain_out = vector_out ? &ops[gain_index] : nullptr;
  const RowOperand* bias = vector_out && ops.size() > gain_index + 1 ? &ops[gain_index + 1] : nullptr;
  llvm::Type* t = e.compute_type(x.dtype);
  auto& b = e.b;
  int64_t n = rl.n;
  auto ld = [&](const RowOperand& r, llvm::Value* base, llvm::Value* kk) { return e.load(*r.op, at(e, r, base, kk)); };
  auto st = [&](const RowOperand& r, llvm::Value* base, llvm::Value* kk, llvm::Value* v) { e.store(*r.op, at(e, r, base, kk), v); };
  llvm::Value* inv_n = llvm::ConstantFP::get(t, 1.0 / static_cast<double>(n));
  int64_t rows_total = product(rl.sizes);
  const bool serial = scalar_out;

  // Losses sum over rows: the function is then called once with [0, extent)
  // (serial). Gain gradients sum over rows in parts fixed by the shape (at
  // most kMaxReductionParts, their partials at most kMaxPartialBytes), each
  // into its own row of partials (gain's, then bias's), whichever thread runs
  // it; the combining call [parts, parts + 1) adds the parts in order
  // (Launch::combine), so the bits do not depend on the thread count.
  llvm::Value* loss = nullptr;
  if (scalar_out) loss = e.make_slot(b.getDoubleTy(), llvm::ConstantFP::get(b.getDoubleTy(), 0.0));
  int64_t parts = 1, per_part = rl.sizes[0];
  llvm::GlobalVariable* partials = nullptr;
  llvm::Value* part = nullptr;  // the part being summed (vector_out)
  auto partial_at = [&](llvm::Value* i) { return b.CreateInBoundsGEP(t, partials, i); };
  if (vector_out) {
    const Parts split = split_into_parts(rl.sizes[0], 2 * n * static_cast<int64_t>(t->getPrimitiveSizeInBits() / 8));
    parts = split.count;
    per_part = split.per_part;
    auto* type = llvm::ArrayType::get(t, static_cast<uint64_t>(parts * 2 * n));
    partials = new llvm::GlobalVariable(e.module, type, false, llvm::GlobalValue::InternalLinkage,
                                        llvm::ConstantAggregateZero::get(type), "partials");
  }

  auto row_body = [&](const std::vector<llvm::Value*>& base) {
    llvm::Value* xb = base[0];
    llvm::Value* ob = base[out_index];
    switch (p.variant) {
      case RowVariant::Softmax:
      case RowVariant::LogSoftmax:
      case RowVariant::CrossEntropyGrad:
      case RowVariant::CrossEntropy: {
        llvm::Value* m = row_max(e, t, n, [&](llvm::Value* kk) { return ld(X, xb, kk); });
        llvm::Value* sum = row_sum(e, t, n, [&](llvm::Value* kk) { return emit_exp(e, b.CreateFSub(ld(X, xb, kk), m)); });
        if (p.variant == RowVariant::LogSoftmax) {
          llvm::Value* shift = b.CreateFAdd(m, emit_log(e, sum));
          e.loop(e.i64(0), e.i64(n), [&](llvm::Value* kk) { st(out, ob, kk, b.CreateFSub(ld(X, xb, kk), shift)); });
        } else if (p.variant == RowVariant::Softmax) {
          llvm::Value* inv = b.CreateFDiv(llvm::ConstantFP::get(t, 1.0), sum);
          e.loop(e.i64(0), e.i64(n), [&](llvm::Value* kk) {
            st(out, ob, kk, b.CreateFMul(emit_exp(e, b.CreateFSub(ld(X, xb, kk), m)), inv));
          });
        } else {
          llvm::Value* target = e.load(*ops[1].op, base[1]);
          e.check_index(target, n, index);
          llvm::Value* tk = b.CreateSExtOrTrunc(target, b.getInt64Ty());
          if (p.variant == RowVariant::CrossEntropy) {
            // -log softmax(x)[t] = log(sum) + m - x[t]
            llvm::Value* row_loss = b.CreateFSub(b.CreateFAdd(emit_log(e, sum), m), ld(X, xb, tk));
            b.CreateStore(b.CreateFAdd(b.CreateLoad(b.getDoubleTy(), loss), b.CreateFPExt(row_loss, b.getDoubleTy())), loss);
          } else {
            // (softmax - onehot) * dloss / rows
            llvm::Value* scale = b.CreateFMul(e.load(k.inputs[2], e.i64(0)), llvm::ConstantFP::get(t, 1.0 / static_cast<double>(rows_total)));
            llvm::Value* inv = b.CreateFMul(b.CreateFDiv(llvm::ConstantFP::get(t, 1.0), sum), scale);
            e.loop(e.i64(0), e.i64(n), [&](llvm::Value* kk) {
              st(out, ob, kk, b.CreateFMul(emit_exp(e, b.CreateFSub(ld(X, xb, kk), m)), inv));
            });
            llvm::Value* target_at = at(e, out, ob, tk);
            e.store(*out.op, target_at, b.CreateFSub(e.load(*out.op, target_at), scale));
          }
        }
        break;
      }
      case RowVariant::SoftmaxGrad: {  // y * (dy - sum(dy * y))
        const RowOperand& dy = ops[1];
        llvm::Value* dot = row_sum(e, t, n, [&](llvm::Value* kk) { return b.CreateFMul(ld(X, xb, kk), ld(dy, base[1], kk)); });
        e.loop(e.i64(0), e.i64(n), [&](llvm::Value* kk) {
          st(out, ob, kk, b.CreateFMul(ld(X, xb, kk), b.CreateFSub(ld(dy, base[1], kk), dot)));
        });
        break;
      }
      case RowVariant::Norm: {
        llvm::Value *mean, *rstd;  // not a structured binding: the lambdas capture them
        std::tie(mean, rstd) = row_stats(e, X, xb, n, p.eps, p.centered);
        e.loop(e.i64(0), e.i64(n), [&](llvm::Value* kk) {
          llvm::Value* y = b.CreateFMul(b.CreateFMul(b.CreateFSub(ld(X, xb, kk), mean), rstd), ld(ops[1], base[1], kk));
          if (p.centered) y = b.CreateFAdd(y, ld(ops[2], base[2], kk));
          st(out, ob, kk, y);
        });
        break;
      }
      case RowVariant::NormGrad: {
        const RowOperand& g = ops[1];
        const RowOperand& dy = ops[2];
        auto gdy = [&](llvm::Value* kk) { return b.CreateFMul(ld(dy, base[2], kk), ld(g, base[1], kk)); };
        auto plus_residual = [&](llvm::Value* kk, llvm::Value* dx) {
          return residual ? b.CreateFAdd(dx, ld(ops[3], base[3], kk)) : dx;
        };
        // With the gains: the part's gain[k] += dy * x_hat (and bias[k] += dy), in dx's loop.
        auto accumulate_gains = [&](llvm::Value* kk, llvm::Value* xhat) {
          if (!with_gains) return;
          llvm::Value* row0 = b.CreateMul(part, e.i64(2 * n));
          llvm::Value* d = ld(dy, base[2], kk);
          llvm::Value* gain_at = partial_at(b.CreateAdd(row0, kk));
          b.CreateStore(b.CreateFAdd(b.CreateLoad(t, gain_at), b.CreateFMul(d, xhat)), gain_at);
          if (bias) {
            llvm::Value* bias_at = partial_at(b.CreateAdd(b.CreateAdd(row0, e.i64(n)), kk));
            b.CreateStore(b.CreateFAdd(b.CreateLoad(t, bias_at), d), bias_at);
          }
        };
        if (!p.centered) {
          // dx = rstd * (g_dy - x * rstd^2 * mean(g_dy * x))
          llvm::Value* rstd = row_stats(e, X, xb, n, p.eps, false).second;
          llvm::Value* mean_gdy_x =
              b.CreateFMul(row_sum(e, t, n, [&](llvm::Value* kk) { return b.CreateFMul(gdy(kk), ld(X, xb, kk)); }), inv_n);
          llvm::Value* coef = b.CreateFMul(b.CreateFMul(rstd, rstd), mean_gdy_x);
          e.loop(e.i64(0), e.i64(n), [&](llvm::Value* kk) {
            st(out, ob, kk, plus_residual(kk, b.CreateFMul(rstd, b.CreateFSub(gdy(kk), b.CreateFMul(ld(X, xb, kk), coef)))));
            accumulate_gains(kk, b.CreateFMul(ld(X, xb, kk), rstd));
          });
          break;
        }
        // dx = rstd * (g_dy - mean(g_dy) - x_hat * mean(g_dy * x_hat)), g_dy = dy * g
        llvm::Value *mean, *rstd;
        std::tie(mean, rstd) = row_stats(e, X, xb, n, p.eps, true);
        auto xhat = [&](llvm::Value* kk) { return b.CreateFMul(b.CreateFSub(ld(X, xb, kk), mean), rstd); };
        llvm::Value* mean_gdy = b.CreateFMul(row_sum(e, t, n, gdy), inv_n);
        llvm::Value* mean_gdy_xhat =
            b.CreateFMul(row_sum(e, t, n, [&](llvm::Value* kk) { return b.CreateFMul(gdy(kk), xhat(kk)); }), inv_n);
        e.loop(e.i64(0), e.i64(n), [&](llvm::Value* kk) {
          llvm::Value* xh = xhat(kk);
          llvm::Value* v = b.CreateFSub(b.CreateFSub(gdy(kk), mean_gdy), b.CreateFMul(xh, mean_gdy_xhat));
          st(out, ob, kk, plus_residual(kk, b.CreateFMul(rstd, v)));
          accumulate_gains(kk, xh);
        });
        break;
      }
    }
  };
  if (!vector_out) {
    for_each_row(e, rl.sizes, ops, row_body);
  } else {
    work_then_combine(
        e, parts,
        [&] {
          e.loop(e.begin, e.end, [&](llvm::Value* pp) {
            part = pp;
            llvm::Value* row0 = b.CreateMul(pp, e.i64(2 * n));
            e.loop(e.i64(0), e.i64(2 * n), [&](llvm::Value* j) { b.CreateStore(llvm::ConstantFP::get(t, 0.0), partial_at(b.CreateAdd(row0, j))); });
            llvm::Value* lo = b.CreateMul(pp, e.i64(per_part));
            llvm::Value* hi = b.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b.CreateAdd(lo, e.i64(per_part)), e.i64(rl.sizes[0]));
            const std::vector<int64_t> rest(rl.sizes.begin() + 1, rl.sizes.end());
            e.loop(lo, hi, [&](llvm::Value* i0) {
              e.nest(rest, -1, [&](const Idx& r) {
                Idx idx{i0};
                idx.insert(idx.end(), r.begin(), r.end());
                std::vector<llvm::Value*> bases;
                for (const RowOperand& o : ops) bases.push_back(e.dot(idx, o.strides));
                row_body(bases);
              });
            });
          });
        },
        [&] {
          e.loop(e.i64(0), e.i64(n), [&](llvm::Value* kk) {
            llvm::Value* gain = e.make_slot(t, llvm::ConstantFP::get(t, 0.0));
            llvm::Value* bias_sum = e.make_slot(t, llvm::ConstantFP::get(t, 0.0));
            e.loop(e.i64(0), e.i64(parts), [&](llvm::Value* pp) {
              llvm::Value* row0 = b.CreateMul(pp, e.i64(2 * n));
              b.CreateStore(b.CreateFAdd(b.CreateLoad(t, gain), b.CreateLoad(t, partial_at(b.CreateAdd(row0, kk)))), gain);
              if (bias)
                b.CreateStore(b.CreateFAdd(b.CreateLoad(t, bias_sum), b.CreateLoad(t, partial_at(b.CreateAdd(b.CreateAdd(row0, e.i64(n)), kk)))),
                              bias_sum);
            });
            st(*gain_out, e.i64(0), kk, b.CreateLoad(t, gain));
            if (bias) st(*bias, e.i64(0), kk, b.CreateLoad(t, bias_sum));
          });
        });
  }
  if (scalar_out) {
    llvm::Value* mean = b.CreateFDiv(b.CreateLoad(b.getDoubleTy(), loss), llvm::ConstantFP::get(b.getDoubleTy(), static_cast<double>(rows_total)));
    e.store(k.output, e.i64(0), b.CreateFPTrunc(mean, t));
  }
  if (vector_out) {
    LoopInfo info = loop_info(parts, x.numel());
    info.combine = true;
    return info;
  }
  return loop_info(rl.sizes[0], x.numel(), !serial);
}

// mse(a, b) = mean((a - b)^2): one serial sum (a scalar output), each inner
// run of elements summed in a vector-friendly f32 loop, the runs in double.
LoopInfo mse(LoopEmitter& e, const Kernel& k) {
  const Operand& a = k.inputs[0];
  std::vector<int64_t> sizes = a.sizes, sa = a.strides, sb = broadcast_strides(k.inputs[1], a.sizes);
  collapse_dims(sizes, {&sa, &sb});
  auto& b = e.b;
  llvm::Type* t = e.compute_type(a.dtype);
  llvm::Value* total = e.make_slot(b.getDoubleTy(), llvm::ConstantFP::get(b.getDoubleTy(), 0.0));
  std::vector<int64_t> outer(sizes.begin(), sizes.end() - 1);
  // The serial kernel is called with [0, 1): that is the loop over nothing.
  e.loop(e.begin, e.end, [&](llvm::Value*) {
    e.nest(outer, -1, [&](const Idx& idx) {
      llvm::Value* ba = e.dot(idx, std::vector<int64_t>(sa.begin(), sa.end() - 1));
      llvm::Value* bb = e.dot(idx, std::vector<int64_t>(sb.begin(), sb.end() - 1));
      llvm::Value* run = row_sum(e, t, sizes.back(), [&](llvm::Value* kk) {
        llvm::Value* d = b.CreateFSub(e.load(a, b.CreateAdd(ba, b.CreateMul(kk, e.i64(sa.back())))),
                                      e.load(k.inputs[1], b.CreateAdd(bb, b.CreateMul(kk, e.i64(sb.back())))));
        return b.CreateFMul(d, d);
      });
      b.CreateStore(b.CreateFAdd(b.CreateLoad(b.getDoubleTy(), total), b.CreateFPExt(run, b.getDoubleTy())), total);
    });
  });
  llvm::Value* mean = b.CreateFDiv(b.CreateLoad(b.getDoubleTy(), total), llvm::ConstantFP::get(b.getDoubleTy(), static_cast<double>(a.numel())));
  e.store(k.output, e.i64(0), b.CreateFPTrunc(mean, t));
  return {1, false};
}

// ------------------------------------------------------------- data movement

// Writes `in` (read through `in_strides` over `sizes`) into `out` at element
// `shift` along `axis`.
void place(LoopEmitter& e, const Operand& in, const Operand& out, int axis, int64_t shift, int split) {
  std::vector<int64_t> sizes = in.sizes, is = in.strides, os = out.strides;
  int64_t base = shift * out.strides[axis];
  e.nest(sizes, split, [&](const Idx& idx) {
    llvm::Value* v = e.load(in, e.dot(idx, is));
    e.store(out, e.dot(idx, os, e.i64(base)), v);
  });
}

void zero_fill(LoopEmitter& e, const Operand& out) {
  e.loop(e.i64(0), e.i64(out.numel()), [&](llvm::Value* i) { e.store(out, i, e.constant(out.dtype, 0)); });
}

LoopInfo concat_or_pad(LoopEmitter& e, const Kernel& k) {
  const ir::ConcatParams& p = k.concat();
  int axis = normalize_axis(p.axis, k.output.sizes.size());
  // Split dim 0 across threads unless the pieces are stacked along it.
  bool split = axis != 0;
  if (p.pad_before) {  // zeros, then x placed at `before`: one serial pass each
    zero_fill(e, k.output);
    place(e, k.inputs[0], k.output, axis, *p.pad_before, -1);
    return {1, false};
  }
  int64_t shift = 0;
  for (const Operand& in : k.inputs) {
    place(e, in, k.output, axis, shift, split ? 0 : -1);
    shift += in.sizes[axis];
  }
  return split ? loop_info(k.output.sizes[0], k.output.numel()) : LoopInfo{1, false};
}

LoopInfo embedding(LoopEmitter& e, const Kernel& k, int index) {
  const Operand& table = k.inputs[0];
  const Operand& ids = k.inputs[1];
  // Named references, not a structured binding: the loops' lambdas capture them.
  const EmbeddingLoop loop = embedding_loop(k);
  const int64_t vocab = loop.vocab;
  const std::vector<int64_t>&id_sizes = loop.id_sizes, &id_strides = loop.id_strides, &out_id_strides = loop.dense_id_strides,
                        &row_sizes = loop.row_sizes, &row_table = loop.row_table, &row_out = loop.row_dense;
  e.nest(id_sizes, 0, [&](const Idx& idx) {
    llvm::Value* id = e.load(ids, e.dot(idx, id_strides));
    e.check_index(id, vocab, index);
    llvm::Value* t_base = e.b.CreateMul(e.b.CreateSExtOrTrunc(id, e.b.getInt64Ty()), e.i64(table.strides[0]));
    llvm::Value* o_base = e.dot(idx, out_id_strides);
    e.nest(row_sizes, -1, [&](const Idx& r) {
      e.store(k.output, e.dot(r, row_out, o_base), e.load(table, e.dot(r, row_table, t_base)));
    });
  });
  return loop_info(id_sizes[0], k.output.numel());
}

// Rows of dy added at ids: serial, so that the sum order (and the result) is
// the same every run.
LoopInfo embedding_grad(LoopEmitter& e, const Kernel& k, int index) {
  const Operand& dy = k.inputs[0];
  const Operand& ids = k.inputs[1];
  const Operand& out = k.output;
  if (k.inputs.size() == 3) {
    // Into the base (whole, contiguous, of out's shape): in place where the memory plan gave out its buffer.
    const Operand& base = k.inputs[2];
    NAPKIN_INTERNAL_CHECK(base.contiguous() && out.contiguous() && base.sizes == out.sizes,
                          "embedding_grad's base ({}) is not a contiguous value of its result's shape", k.name);
    if (base.byte_offset != out.byte_offset)
      e.loop(e.i64(0), e.i64(out.numel()), [&](llvm::Value* i) { e.store(out, i, e.load(base, i)); });
  } else {
    zero_fill(e, out);
  }
  const EmbeddingLoop loop = embedding_loop(k);
  const int64_t vocab = loop.vocab;
  const std::vector<int64_t>&id_sizes = loop.id_sizes, &id_strides = loop.id_strides, &dy_id_strides = loop.dense_id_strides,
                        &row_sizes = loop.row_sizes, &row_out = loop.row_table, &row_dy = loop.row_dense;
  e.loop(e.begin, e.end, [&](llvm::Value*) {
    e.nest(id_sizes, -1, [&](const Idx& idx) {
      llvm::Value* id = e.load(ids, e.dot(idx, id_strides));
      e.check_index(id, vocab, index);
      llvm::Value* o_base = e.b.CreateMul(e.b.CreateSExtOrTrunc(id, e.b.getInt64Ty()), e.i64(out.strides[0]));
      llvm::Value* d_base = e.dot(idx, dy_id_strides);
      e.nest(row_sizes, -1, [&](const Idx& r) {
        llvm::Value* p = e.dot(r, row_out, o_base);
        e.store(out, p, e.b.CreateFAdd(e.load(out, p), e.load(dy, e.dot(r, row_dy, d_base))));
      });
    });
  });
  return {1, false};
}

// A contraction the GEMM library cannot take (see analysis/contraction.h):
// out = 0, then out[c] += a[..] * b[..] over every axis. Correct, not fast.
LoopInfo contraction_loops(LoopEmitter& e, const Kernel& k) {
  const Operand& a = k.inputs[0];
  const Operand& bop = k.inputs[1];
  const Operand& out = k.output;
  // Output axes (a stride in C) outside, summed axes inside: each output
  // element is summed in a register of its compute type (f32 for bf16/f16
  // outputs, the accumulator the mixed-precision rules promise), then stored
  // once, rounded once.
  std::vector<int64_t> out_sizes, oa, ob, oc, sum_sizes, ra, rb;
  for (const ContractionAxis& ax : k.contraction) {
    if (ax.c != 0 || ax.size == 1) {
      out_sizes.push_back(ax.size), oa.push_back(ax.a), ob.push_back(ax.b), oc.push_back(ax.c);
    } else {
      sum_sizes.push_back(ax.size), ra.push_back(ax.a), rb.push_back(ax.b);
    }
  }
  llvm::Type* t = e.compute_type(out.dtype);
  e.loop(e.begin, e.end, [&](llvm::Value*) {
    e.nest(out_sizes, -1, [&](const Idx& idx) {
      llvm::Value* base_a = e.dot(idx, oa);
      llvm::Value* base_b = e.dot(idx, ob);
      const bool fp = t->isFloatingPointTy();
      llvm::Value* acc = e.make_slot(t, fp ? llvm::ConstantFP::get(t, 0.0) : llvm::ConstantInt::get(t, 0));
      e.nest(sum_sizes, -1, [&](const Idx& r) {
        llvm::Value* x = e.convert(e.load(a, e.dot(r, ra, base_a)), a.dtype, out.dtype);
        llvm::Value* y = e.convert(e.load(bop, e.dot(r, rb, base_b)), bop.dtype, out.dtype);
        llvm::Value* sum = e.b.CreateLoad(t, acc);
        e.b.CreateStore(fp ? e.b.CreateFAdd(sum, e.b.CreateFMul(x, y)) : e.b.CreateAdd(sum, e.b.CreateMul(x, y)), acc);
      });
      e.store(out, e.dot(idx, oc), e.b.CreateLoad(t, acc));
    });
  });
  return {1, false};
}

// A constant (one element) or arange (element i is i).
LoopInfo fill(LoopEmitter& e, const Kernel& k) {
  const ir::FillParams& p = k.fill();
  switch (p.pattern) {
    case ir::FillPattern::Constant:
      e.loop(e.begin, e.end, [&](llvm::Value*) { e.store(k.output, e.i64(0), e.constant(k.output.dtype, p.value)); });
      return {1, false};
    case ir::FillPattern::Arange:
      e.loop(e.begin, e.end, [&](llvm::Value* i) { e.store(k.output, i, e.convert(i, ir::DType::I64, k.output.dtype)); });
      return {k.output.numel(), false};
  }
  return {1, false};
}

}  // namespace

LoopInfo emit_kernel(LoopEmitter& e, const Kernel& k, int index) {
  LoopInfo info;
  if (!k.batch.empty()) {
    info = batched(e, k);
    e.b.CreateRetVoid();
    return info;
  }
  switch (k.kind) {
    case KernelKind::Fill: info = fill(e, k); break;
    case KernelKind::Elementwise: info = elementwise(e, k); break;
    case KernelKind::FusedElementwise: info = fused(e, k); break;
    case KernelKind::Reduction: info = reduction(e, k); break;
    case KernelKind::ContractionLoops: info = contraction_loops(e, k); break;
    case KernelKind::Concat: info = concat_or_pad(e, k); break;
    case KernelKind::Gather: info = embedding(e, k, index); break;
    case KernelKind::ScatterAdd: info = embedding_grad(e, k, index); break;
    case KernelKind::Rows: info = rows(e, k, index); break;
    case KernelKind::Mse: info = mse(e, k); break;
    case KernelKind::Gemm:
      NAPKIN_INTERNAL_CHECK(k.epilogue.has_value(), "a GEMM kernel ({}) is the library's call, not a loop", k.name);
      info = gemm_epilogue(e, k);
      break;
    case KernelKind::Attention:
      NAPKIN_INTERNAL_CHECK(false, "an attention kernel ({}) is the runtime's call (runtime/attention.h), not a loop", k.name);
    case KernelKind::Classifier:
      NAPKIN_INTERNAL_CHECK(false, "a classifier kernel ({}) is the runtime's call (runtime/classifier.h), not a loop", k.name);
    case KernelKind::CachedAttention:
      NAPKIN_INTERNAL_CHECK(false, "a cached attention kernel ({}) is the runtime's call (runtime/cached_attention.h), not a loop",
                            k.name);
    case KernelKind::Rope:
      NAPKIN_INTERNAL_CHECK(false, "a rope kernel ({}) is the runtime's call (runtime/rope.h), not a loop", k.name);
    case KernelKind::Collective:
      NAPKIN_INTERNAL_CHECK(false, "a collective kernel ({}) is the runtime's copy and call to the ranks (runtime/executor.h), not a loop",
                            k.name);
    case KernelKind::TopK:
    case KernelKind::MoeSlots:
      NAPKIN_INTERNAL_CHECK(false, "a routing kernel ({}) is the runtime's call (runtime/routing.h), not a loop", k.name);
  }
  e.b.CreateRetVoid();
  return info;
}

}  // namespace napkin::codegen::cpu
