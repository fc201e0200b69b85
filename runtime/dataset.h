// What feeds a model's inputs each step: a Dataset writes one batch into the
// trainer's input buffers. Batches are a pure function of (spec, step), so the
// step counter is the loader's whole state: a checkpoint stores the step, and
// a resumed run sees exactly the batches it would have seen.
//
// A data file that shrinks while the trainer reads it is an Error at the next
// batch (mapped_file.h), never a SIGBUS.
//
// Two formats.
//
// "tokens": one raw little-endian token file (token_dtype "u16", "u32" or "i32"), the
// usual pre-tokenized LM corpus, or llm.c's .bin (a 1,024-byte header of
// magic, version and token count, then u16 or u32 tokens as the header says;
// recognised by its magic, and its header checked). The model must have exactly two i32 inputs of
// shape [batch, seq]: the first gets window[0:seq], the second window[1:seq+1]
// (inputs and next-token targets). With n tokens in the file:
//   train part  tokens [0, n_train), n_train = floor(split * n)
//   eval part   tokens [n_train, n)            (needs at least seq + 1 tokens)
// For a part of m tokens starting at `base`, window p (0-based) starts at
//   sequential  base + (p mod W) * seq,  W = (m - 1) / seq   (integer division)
// and training row r of step s is window p = s * rows + r. With order
// "random" training row r of step s instead starts at base + u, u uniform in
// [0, m - seq - 1] (CS336's get_batch), drawn as below from
// Rng(seed, stream_for_name("data.train") + s): one draw per row, rows in order.
//
// A step's rows: a step of M micro-batches (gradient accumulation times
// ranks, docs/distributed.md) has rows = M * batch rows, and micro-batch m
// holds rows [m * batch, (m + 1) * batch) of it. So the rows of a step, the
// global batch, do not depend on how they are split into micro-batches and
// ranks, and M = 1 is the plain one-batch step.
// Eval batches are always sequential: eval batch i, row r is window
// p = i * batch + r of the eval part, so every evaluation starts at window 0.
// Token ids are checked against vocab_bound (if nonzero) as batches are read.
//
// "npy": one .npy file per input (files: input name -> path), each of shape
// [N, ...] where ... is the input's shape after the batch dim, all with the
// same N. The dtype must be the input's (f32: <f4, f64: <f8, f16: <f2, bool:
// |b1), except that integer inputs (i32, i64, u8) accept any integer file
// (<i4 <i8 <u2 |u1), converted with a range check, and bf16 inputs take <f4,
// rounded to nearest even (numpy has no bf16). Rows:
//   train rows  [0, n_train), n_train = floor(split * N)
//   eval rows   [n_train, N); if split is 1, eval reads the train rows
// Training row r of step s is example p = s * rows + r:
//   sequential  row p mod n_train
//   random      row perm_e[p mod n_train], e = p / n_train (the epoch), where
//               perm_e is a Fisher-Yates shuffle of 0..n_train-1 driven by
//               Rng(seed, stream_for_name("data.epoch") + e): for i = n_train-1
//               down to 1, j = draw(i + 1), swap(perm[i], perm[j])
// Eval batch i, row r reads eval row (i * batch + r) mod n_eval.
//
// draw(k), a uniform integer in [0, k): two words a, b of the Rng, then
// ((a * 2^32 + b) * k) >> 64 (Lemire's multiply-shift; its bias is below
// k / 2^64).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor_types.h"

namespace napkin::runtime {

// One model input: the trainer writes each batch to dest (row-major, dense).
struct InputSlot {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;   // [batch, ...]
  char* dest;
};

enum class DataFormat : uint8_t { Tokens, Npy };
enum class DataOrder : uint8_t { Random, Sequential };

// The text of train.data and the flags, parsed once (WHERE names the data in an Error).
DataFormat parse_data_format(const std::string& text);                       // "tokens" | "npy"
DataOrder parse_data_order(const std::string& where, const std::string& text);  // "random" | "sequential"
DType parse_token_dtype(const std::string& where, const std::string& text);     // "u16" | "u32" | "i32"

// Where a token file's ids are and what they are: llm.c's 1,024-byte header
// when the file starts with its magic (whose dtype then wins), else raw
// `dtype` ids from byte 0. Throws Error, naming `path`, for a header that
// does not hold or a size that is not a whole number of ids.
struct TokenFileLayout {
  DType dtype;
  size_t offset = 0;  // bytes before the first id
  int64_t count = 0;  // ids
  std::string llmc;   // what llm.c file it is ("llm.c .bin (GPT-2, u16 tokens)"), "" for a raw file
};
TokenFileLayout token_file_layout(const std::string& path, const char* data, size_t size, DType dtype);
// The id stored at `p` as `dtype` (u16, u32 or i32, little-endian).
int64_t read_token_id(const char* p, DType dtype);

struct DataSpec {
  DataFormat format = DataFormat::Tokens;
  std::string path;                            // tokens: the token file
  DType token_dtype = DType::U16;              // tokens: U16, U32 or I32
  std::map<std::string, std::string> files;    // npy: input name -> .npy file
  DataOrder order = DataOrder::Random;
  double split = 1.0;                          // fraction used for training, in (0, 1]
  uint64_t seed = 0;
  int64_t vocab_bound = 0;                     // tokens: ids must be below it (0: unchecked)
  int64_t micro_batches_per_step = 1;          // M: a step's rows are M batches
};

class Dataset {
 public:
  // Opens and validates the files against the inputs; every mismatch is an
  // Error naming the file and what is wrong.
  static std::unique_ptr<Dataset> open(const DataSpec& spec, std::vector<InputSlot> inputs);
  virtual ~Dataset() = default;

  // Writes micro-batch `micro_batch` (in [0, M)) of training step `step`
  // into every input.
  virtual void fill_train(int64_t step, int64_t micro_batch) = 0;
  void fill_train(int64_t step) { fill_train(step, 0); }
  // Writes eval batch `index` (0, 1, ... within one evaluation). Throws Error
  // saying why if there is no eval data.
  virtual void fill_eval(int64_t index) = 0;
  // Examples in one pass: sequential windows W (tokens) or rows (npy).
  virtual int64_t train_examples() const = 0;
  virtual int64_t eval_examples() const = 0;  // 0 when there is no eval data
  bool has_eval() const { return eval_examples() > 0; }
  // Why there is no eval data ("" when there is): the trainer warns with it.
  virtual std::string eval_problem() const = 0;
  int64_t micro_batches_per_step() const { return micro_batches_per_step_; }

  // The files it reads, in the inputs' order (the ranks of a job compare
  // them, runtime/rank_agreement.h).
  virtual std::vector<std::string> files() const = 0;

  // One line for the log, e.g. "data/tiny.u16: 1,234,567 u16 tokens
  // (1,111,110 train / 123,457 eval), random windows of 129".
  virtual std::string describe() const = 0;

 protected:
  // Rows of one step (M batches of the inputs' batch dim).
  int64_t rows_per_step() const { return micro_batches_per_step_ * batch_rows(); }
  virtual int64_t batch_rows() const = 0;
  void check_micro_batch(int64_t micro_batch) const;

 private:
  int64_t micro_batches_per_step_ = 1;
};

// 1234567 -> "1,234,567".
std::string with_commas(int64_t n);

}  // namespace napkin::runtime
