// The runtime's fused classifier: the CPU kernel of a Classifier plan kernel
// (codegen/plan.h; the math is ir/loop.h's ClassifierParams), described once
// at start-up and run every step, like Gemm and Attention.
//
//   forward   (x, w, targets) -> loss, lse
//   backward  (x, w, targets, lse, dloss) -> dx, dw
//
// x and dx: [rows, d], row stride x_row_stride (dx contiguous); w and dw:
// [vocab, d], w by its two strides (one of them 1), dw contiguous; targets:
// [rows] i32 or i64 contiguous; lse: [rows] and loss, dloss: one element, f32
// (f64 for f64 operands).
//
// Algorithm: the vocabulary in chunks of kChunk classes. Forward: per chunk,
// each block of kRowBlock rows (the work items the pool shares) takes its
// logits tile from one runtime::Gemm in x's type (for bf16 the oneDNN bf16
// primitive: f32 sums rounded once, as the logits are defined), and folds it
// into a running max and sum per row (online log-sum-exp); the loss is
// summed over rows in order at the end. Backward: per chunk, each row block
// recomputes its logits, makes g = (exp(l - lse) - onehot) * dloss / rows
// rounded to x's type in place, and adds g·w_chunk (a Gemm into f32) to its
// f32 dx rows; then the chunk's dw rows are gᵀ·x over all rows, one Gemm per
// block of classes. Every product is one work item run on the calling pool
// thread with a shape fixed by the descriptor, and every sum runs in an
// order fixed by the shape, so results are bit-identical for any thread
// count. No [rows, vocab] value exists: the workspace is rows x kChunk in
// x's type.
//
// Types: x, w, dx, dw share one element type (f32, f64, bf16 or f16);
// arithmetic in f32 (f64 for f64), low precision widened exactly, rounded to
// nearest even on store. A target outside [0, vocab) is an Error naming the row.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/gemm.h"
#include "runtime/thread_pool.h"

namespace napkin::runtime {

struct ClassifierDesc {
  int64_t rows = 1, vocab = 1, d = 1;
  int64_t x_row_stride = 0;              // elements between rows of x (d stride is 1)
  int64_t w_v_stride = 0, w_d_stride = 1;  // w's strides over [vocab, d]
  bool targets_i64 = false;
  bool operator==(const ClassifierDesc&) const = default;
};

class Classifier {
 public:
  static constexpr int64_t kChunk = 512;  // classes per chunk: a row block's tile stays in L2

  // Validates the descriptor (throws runtime::Error naming the problem).
  Classifier(ClassifierDesc desc, GemmType type);
  ~Classifier();
  Classifier(Classifier&&) noexcept;

  void forward(const void* x, const void* w, const void* targets, void* loss, void* lse, ThreadPool& pool) const;
  void backward(const void* x, const void* w, const void* targets, const void* lse, const void* dloss, void* dx,
                void* dw, ThreadPool& pool) const;

  const ClassifierDesc& desc() const { return d_; }
  GemmType type() const { return type_; }

  struct Impl;  // the products and buffers (classifier.cpp)

 private:
  ClassifierDesc d_;
  GemmType type_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace napkin::runtime
