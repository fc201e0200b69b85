#include "runtime/dataset.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>

#include "runtime/error.h"
#include "runtime/float_formats.h"
#include "runtime/mapped_file.h"
#include "runtime/npy.h"
#include "runtime/rng.h"
#include "runtime/safetensors.h"

namespace napkin::runtime {

namespace {

// A uniform integer in [0, k), as documented in dataset.h.
uint64_t draw(Rng& rng, uint64_t k) {
  uint64_t a = rng.next_u32(), b = rng.next_u32();
  return static_cast<uint64_t>((static_cast<unsigned __int128>((a << 32) | b) * k) >> 64);
}

// 0.95 -> "0.95" (std::to_string would say 0.950000).
std::string number_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

int64_t split_count(const std::string& where, double split, int64_t n) {
  if (!(split > 0.0 && split <= 1.0)) throw Error(where + ": split " + number_text(split) + " is not in (0, 1]");
  return static_cast<int64_t>(std::floor(split * static_cast<double>(n)));
}

// Batches are indexed from 0; a negative index would read before the data.
void check_index(const char* what, int64_t index) {
  if (index < 0) throw std::invalid_argument(std::string("Dataset: negative ") + what + " " + std::to_string(index));
}

// ---------------------------------------------------------------- tokens

}  // namespace

// llm.c's .bin (dev/data/data_common.py write_datafile): 256 little-endian
// int32s, [0] the magic, [1] the version, [2] the token count, the rest 0;
// then the tokens, u16 (GPT-2: magic 20240520, version 1) or u32 (Llama 3:
// 20240801, version 7). A file that starts with either magic is read as
// one, and its header must hold: a raw token file starting so would need
// its first two ids to spell a magic number.
TokenFileLayout token_file_layout(const std::string& path, const char* data, size_t size, DType dtype) {
  constexpr int64_t kHeaderInts = 256, kHeaderBytes = kHeaderInts * 4;
  constexpr int32_t kGpt2Magic = 20240520, kLlama3Magic = 20240801;
  int32_t magic = 0;
  if (size >= 4) std::memcpy(&magic, data, 4);
  if (magic != kGpt2Magic && magic != kLlama3Magic) {  // a raw token file
    const auto bytes = static_cast<size_t>(element_bytes(dtype));
    if (size % bytes != 0)
      throw Error(path + ": " + std::to_string(size) + " bytes is not a whole number of " +
                  std::string(dtype_name(dtype)) + " tokens");
    return {dtype, 0, static_cast<int64_t>(size / bytes), ""};
  }
  const std::string kind = magic == kGpt2Magic ? "llm.c .bin (GPT-2, u16 tokens)" : "llm.c .bin (Llama 3, u32 tokens)";
  if (size < static_cast<size_t>(kHeaderBytes))
    throw Error(path + ": starts with " + kind + "'s magic " + std::to_string(magic) + " but is " +
                with_commas(static_cast<int64_t>(size)) + " bytes, shorter than its 1,024-byte header");
  int32_t header[3];
  std::memcpy(header, data, sizeof header);
  const int32_t want_version = magic == kGpt2Magic ? 1 : 7;
  if (header[1] != want_version)
    throw Error(path + ": " + kind + " header has version " + std::to_string(header[1]) + ", expected " +
                std::to_string(want_version));
  const DType file_dtype = magic == kGpt2Magic ? DType::U16 : DType::U32;
  const auto bytes = static_cast<int64_t>(element_bytes(file_dtype));
  const int64_t count = header[2];
  const int64_t after = static_cast<int64_t>(size) - kHeaderBytes;
  if (count < 0 || count != after / bytes || after % bytes != 0)
    throw Error(path + ": " + kind + " header says " + with_commas(count) + " tokens, but the file holds " +
                with_commas(after) + " bytes after the header (" + with_commas(after / bytes) +
                " tokens): truncated or not written by llm.c");
  return {file_dtype, static_cast<size_t>(kHeaderBytes), count, kind};
}

int64_t read_token_id(const char* p, DType dtype) {
  if (dtype == DType::U16) {
    uint16_t t;
    std::memcpy(&t, p, 2);
    return t;
  }
  if (dtype == DType::U32) {
    uint32_t t;
    std::memcpy(&t, p, 4);
    return t;
  }
  int32_t t;
  std::memcpy(&t, p, 4);
  return t;
}

namespace {

class TokenDataset : public Dataset {
 public:
  TokenDataset(const DataSpec& spec, std::vector<InputSlot> inputs) : spec_(spec), file_(spec.path) {
    const std::string& path = spec.path;
    const TokenFileLayout layout = token_file_layout(path, file_.data(), file_.size(), spec.token_dtype);
    token_dtype_ = layout.dtype;
    token_bytes_ = static_cast<size_t>(element_bytes(token_dtype_));
    offset_ = static_cast<int64_t>(layout.offset);
    n_ = layout.count;
    llmc_ = layout.llmc;

    std::string names;
    for (const InputSlot& s : inputs) names += (names.empty() ? "" : ", ") + s.name + " " + tensor_type_text(dtype_name(s.dtype), s.shape);
    if (inputs.size() != 2 || inputs[0].dtype != DType::I32 || inputs[1].dtype != DType::I32 || inputs[0].shape.size() != 2 ||
        inputs[0].shape != inputs[1].shape)
      throw Error(path + ": a token file feeds exactly two i32 inputs of the same shape [batch, seq] (the tokens, then "
                         "the next-token targets); this model's inputs are " + (names.empty() ? "none" : names));
    x_ = inputs[0];
    y_ = inputs[1];
    batch_ = x_.shape[0];
    seq_ = x_.shape[1];

    n_train_ = split_count(path, spec.split, n_);
    if (n_train_ < seq_ + 1)
      throw Error(path + ": too few tokens: the train part has " + with_commas(n_train_) + " of " + with_commas(n_) +
                  " tokens, but one window needs seq + 1 = " + std::to_string(seq_ + 1));
    const int64_t n_eval = n_ - n_train_;
    if (n_eval >= seq_ + 1) {
      eval_windows_ = (n_eval - 1) / seq_;
    } else {
      eval_problem_ = path + ": no eval data: split " + number_text(spec.split) + " holds out " +
                      with_commas(n_eval) + " tokens, but one eval window needs seq + 1 = " +
                      std::to_string(seq_ + 1) + " (lower the split)";
    }
  }

  void fill_train(int64_t step, int64_t micro_batch) override {
    check_index("step", step);
    check_micro_batch(micro_batch);
    Rng rng(spec_.seed, stream_for_name("data.train") + static_cast<uint64_t>(step));
    const int64_t windows = (n_train_ - 1) / seq_;
    const int64_t first = micro_batch * batch_, rows = rows_per_step();
    // Random rows are the step's draws in order: skip the earlier micro-batches'.
    if (spec_.order == DataOrder::Random)
      for (int64_t r = 0; r < first; ++r) draw(rng, static_cast<uint64_t>(n_train_ - seq_));
    for (int64_t r = 0; r < batch_; ++r) {
      const int64_t start = spec_.order == DataOrder::Random
                                ? static_cast<int64_t>(draw(rng, static_cast<uint64_t>(n_train_ - seq_)))
                                : ((step * rows + first + r) % windows) * seq_;
      copy_window(r, start);
    }
    file_.check_intact();
  }

  void fill_eval(int64_t index) override {
    check_index("eval batch", index);
    if (!eval_problem_.empty()) throw Error(eval_problem_);
    for (int64_t r = 0; r < batch_; ++r) copy_window(r, n_train_ + ((index * batch_ + r) % eval_windows_) * seq_);
    file_.check_intact();
  }

  std::vector<std::string> files() const override { return {spec_.path}; }
  int64_t train_examples() const override { return (n_train_ - 1) / seq_; }
  int64_t batch_rows() const override { return batch_; }
  int64_t eval_examples() const override { return eval_windows_; }
  std::string eval_problem() const override { return eval_problem_; }

  std::string describe() const override {
    return spec_.path + ": " + with_commas(n_) + " " + (llmc_.empty() ? std::string(dtype_name(spec_.token_dtype)) : llmc_) +
           " tokens (" + with_commas(n_train_) + " train / " + with_commas(n_ - n_train_) + " eval), " +
           (spec_.order == DataOrder::Random ? "random" : "sequential") + " windows of " + std::to_string(seq_ + 1);
  }

 private:
  int64_t token(int64_t i) const { return read_token_id(file_.data() + offset_ + i * token_bytes_, token_dtype_); }

  // Row r of x gets tokens [start, start + seq), row r of y [start + 1, start + seq + 1).
  void copy_window(int64_t r, int64_t start) {
    int32_t* x = reinterpret_cast<int32_t*>(x_.dest) + r * seq_;
    int32_t* y = reinterpret_cast<int32_t*>(y_.dest) + r * seq_;
    for (int64_t i = 0; i <= seq_; ++i) {
      const int64_t t = token(start + i);
      if (t < 0 || (spec_.vocab_bound > 0 && t >= spec_.vocab_bound))
        throw Error(spec_.path + ": token " + std::to_string(t) + " at position " + with_commas(start + i) +
                    (t < 0 ? " is negative" : " is not below the vocabulary size " + std::to_string(spec_.vocab_bound)));
      if (i < seq_) x[i] = static_cast<int32_t>(t);
      if (i > 0) y[i - 1] = static_cast<int32_t>(t);
    }
  }

  DataSpec spec_;
  MappedFile file_;
  DType token_dtype_ = DType::U16;  // the file's: the spec's, or what llm.c's header says
  size_t token_bytes_ = 0;
  int64_t offset_ = 0;  // bytes before the first token: llm.c's header
  std::string llmc_;    // what an llm.c file is, for describe(); empty for a raw token file
  InputSlot x_, y_;
  int64_t batch_ = 0, seq_ = 0;
  int64_t n_ = 0, n_train_ = 0, eval_windows_ = 0;
  std::string eval_problem_;
};

// ---------------------------------------------------------------- npy

// How a file's elements become an input's.
enum class Conversion { Copy, Integer, F32ToBF16 };

struct Column {
  InputSlot slot;
  NpyArray array;
  Conversion conversion;
  size_t row_elements;  // elements per row
  size_t slot_itemsize;
};

class NpyDataset : public Dataset {
 public:
  NpyDataset(const DataSpec& spec, std::vector<InputSlot> inputs) : spec_(spec) {
    std::set<std::string> input_names;
    std::string names;
    for (const InputSlot& s : inputs) {
      input_names.insert(s.name);
      names += (names.empty() ? "" : ", ") + s.name;
    }
    for (const auto& [name, path] : spec.files)
      if (!input_names.count(name))
        throw Error(path + ": given for input '" + name + "', which this model does not have (its inputs: " + names + ")");

    for (const InputSlot& s : inputs) {
      auto it = spec.files.find(s.name);
      if (it == spec.files.end()) throw Error("no .npy file given for input '" + s.name + "' " + tensor_type_text(dtype_name(s.dtype), s.shape));
      columns_.push_back(open_column(s, it->second));
    }
    if (columns_.empty()) throw Error("npy data: the model has no inputs to feed");

    const Column& first = columns_.front();
    batch_ = first.slot.shape[0];
    rows_ = first.array.shape[0];
    for (const Column& c : columns_) {
      if (c.slot.shape[0] != batch_)
        throw Error("npy data: inputs '" + first.slot.name + "' and '" + c.slot.name + "' have different batch sizes (" +
                    std::to_string(batch_) + " and " + std::to_string(c.slot.shape[0]) + ")");
      if (c.array.shape[0] != rows_)
        throw Error(c.array.path() + " has " + with_commas(c.array.shape[0]) + " rows but " + first.array.path() +
                    " has " + with_commas(rows_));
    }
    if (rows_ == 0) throw Error(first.array.path() + ": no rows");
    n_train_ = split_count(first.array.path(), spec.split, rows_);
    if (n_train_ == 0)
      throw Error(first.array.path() + ": split " + number_text(spec.split) + " of " + with_commas(rows_) +
                  " rows leaves no training rows");
    // With split 1 there is nothing held out: evaluation reads the train rows.
    eval_base_ = spec.split == 1.0 ? 0 : n_train_;
    n_eval_ = rows_ - eval_base_;
    if (n_eval_ == 0)
      eval_problem_ = first.array.path() + ": no eval data: split " + number_text(spec.split) + " of " +
                      with_commas(rows_) + " rows holds out none";
  }

  void fill_train(int64_t step, int64_t micro_batch) override {
    check_index("step", step);
    check_micro_batch(micro_batch);
    for (int64_t r = 0; r < batch_; ++r) {
      const int64_t p = step * rows_per_step() + micro_batch * batch_ + r;
      const int64_t i = p % n_train_;
      copy_row(r, spec_.order == DataOrder::Random ? permutation(p / n_train_)[static_cast<size_t>(i)] : i);
    }
    check_intact();
  }

  void fill_eval(int64_t index) override {
    check_index("eval batch", index);
    if (!eval_problem_.empty()) throw Error(eval_problem_);
    for (int64_t r = 0; r < batch_; ++r) copy_row(r, eval_base_ + (index * batch_ + r) % n_eval_);
    check_intact();
  }

  std::vector<std::string> files() const override {
    std::vector<std::string> paths;
    for (const Column& c : columns_) paths.push_back(c.array.path());
    return paths;
  }
  int64_t train_examples() const override { return n_train_; }
  int64_t batch_rows() const override { return batch_; }
  int64_t eval_examples() const override { return n_eval_; }
  std::string eval_problem() const override { return eval_problem_; }

  std::string describe() const override {
    std::string paths;
    for (const Column& c : columns_) paths += (paths.empty() ? "" : ", ") + c.array.path();
    const std::string split = eval_base_ == 0 ? "all train, eval on the train rows"
                                              : with_commas(n_train_) + " train / " + with_commas(n_eval_) + " eval";
    const std::string order = spec_.order == DataOrder::Random ? "random order, reshuffled each epoch" : "sequential order";
    return paths + ": " + with_commas(rows_) + " rows (" + split + "), " + order;
  }

 private:
  static Column open_column(const InputSlot& s, const std::string& path) {
    Column c{s, read_npy(path), Conversion::Copy, 1, 0};
    const NpyArray& a = c.array;
    if (s.shape.empty()) throw Error("input '" + s.name + "' has no batch dimension");
    std::vector<int64_t> want(s.shape);
    want[0] = a.shape.empty() ? 0 : a.shape[0];
    if (a.shape.size() != s.shape.size() || a.shape != want) {
      std::string rest = "(N";
      for (size_t i = 1; i < s.shape.size(); ++i) rest += ", " + std::to_string(s.shape[i]);
      throw Error(path + ": shape " + npy_shape_text(a.shape) + " does not fit input '" + s.name + "' " +
                  tensor_type_text(dtype_name(s.dtype), s.shape) + ": expected " + rest + (s.shape.size() == 1 ? ",)" : ")") +
                  ", one row per example");
    }
    if (a.dtype == s.dtype) c.conversion = Conversion::Copy;
    else if (is_integer(a.dtype) && is_integer(s.dtype)) c.conversion = Conversion::Integer;
    else if (a.dtype == DType::F32 && s.dtype == DType::BF16) c.conversion = Conversion::F32ToBF16;
    else throw Error(path + ": dtype " + a.descr + " but input '" + s.name + "' is " + std::string(dtype_name(s.dtype)));
    c.slot_itemsize = static_cast<size_t>(element_bytes(s.dtype));
    for (size_t i = 1; i < s.shape.size(); ++i) c.row_elements *= static_cast<size_t>(s.shape[i]);
    return c;
  }

  // perm_epoch, as documented in dataset.h; the latest one is kept, since
  // consecutive steps almost always share an epoch.
  const std::vector<int64_t>& permutation(int64_t epoch) {
    if (epoch != perm_epoch_) {
      perm_.resize(static_cast<size_t>(n_train_));
      for (int64_t i = 0; i < n_train_; ++i) perm_[static_cast<size_t>(i)] = i;
      Rng rng(spec_.seed, stream_for_name("data.epoch") + static_cast<uint64_t>(epoch));
      for (int64_t i = n_train_ - 1; i >= 1; --i)
        std::swap(perm_[static_cast<size_t>(i)], perm_[draw(rng, static_cast<uint64_t>(i + 1))]);
      perm_epoch_ = epoch;
    }
    return perm_;
  }

  void check_intact() const {
    for (const Column& c : columns_) c.array.file.check_intact();
  }

  void copy_row(int64_t r, int64_t row) {
    for (Column& c : columns_) {
      const char* src = c.array.data + static_cast<size_t>(row) * c.row_elements * c.array.itemsize;
      char* dst = c.slot.dest + static_cast<size_t>(r) * c.row_elements * c.slot_itemsize;
      switch (c.conversion) {
        case Conversion::Copy:
          std::memcpy(dst, src, c.row_elements * c.slot_itemsize);
          break;
        case Conversion::F32ToBF16:
          for (size_t i = 0; i < c.row_elements; ++i) {
            float f;
            std::memcpy(&f, src + 4 * i, 4);
            uint16_t b = float_to_bf16_bits(f);
            std::memcpy(dst + 2 * i, &b, 2);
          }
          break;
        case Conversion::Integer:
          for (size_t i = 0; i < c.row_elements; ++i)
            store_integer(c, row, dst + i * c.slot_itemsize, load_integer(c.array.dtype, src + i * c.array.itemsize));
          break;
      }
    }
  }

  static int64_t load_integer(DType dtype, const char* p) {
    if (dtype == DType::U8) return static_cast<unsigned char>(*p);
    if (dtype == DType::U16) return read<uint16_t>(p);
    if (dtype == DType::I32) return read<int32_t>(p);
    return read<int64_t>(p);
  }

  void store_integer(const Column& c, int64_t row, char* dst, int64_t v) const {
    const DType t = c.slot.dtype;
    const bool fits = t == DType::I64 || (t == DType::I32 && v >= std::numeric_limits<int32_t>::min() &&
                                          v <= std::numeric_limits<int32_t>::max()) ||
                      (t == DType::U16 && v >= 0 && v <= 65535) || (t == DType::U8 && v >= 0 && v <= 255);
    if (!fits)
      throw Error(c.array.path() + ": row " + std::to_string(row) + " holds " + std::to_string(v) +
                  ", which does not fit in " + std::string(dtype_name(t)) + " input '" + c.slot.name + "'");
    if (t == DType::I64) std::memcpy(dst, &v, 8);
    else if (t == DType::I32) write(dst, static_cast<int32_t>(v));
    else if (t == DType::U16) write(dst, static_cast<uint16_t>(v));
    else write(dst, static_cast<uint8_t>(v));
  }

  template <typename T>
  static T read(const char* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  template <typename T>
  static void write(char* p, T v) {
    std::memcpy(p, &v, sizeof v);
  }

  DataSpec spec_;
  std::vector<Column> columns_;
  int64_t batch_ = 0, rows_ = 0, n_train_ = 0, eval_base_ = 0, n_eval_ = 0;
  std::string eval_problem_;
  std::vector<int64_t> perm_;
  int64_t perm_epoch_ = -1;
};

}  // namespace

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return n < 0 ? "-" + s : s;
}

DataFormat parse_data_format(const std::string& text) {
  if (text == "tokens" || text == "npy") return text == "tokens" ? DataFormat::Tokens : DataFormat::Npy;
  throw Error("data format '" + text + "' is neither 'tokens' nor 'npy'");
}

DataOrder parse_data_order(const std::string& where, const std::string& text) {
  if (text == "random" || text == "sequential") return text == "random" ? DataOrder::Random : DataOrder::Sequential;
  throw Error(where + ": order '" + text + "' is neither 'random' nor 'sequential'");
}

DType parse_token_dtype(const std::string& where, const std::string& text) {
  if (text == "u16" || text == "u32" || text == "i32") return parse_dtype(text);
  throw Error(where + ": token dtype '" + text + "' is none of u16, u32, i32");
}

std::unique_ptr<Dataset> Dataset::open(const DataSpec& spec, std::vector<InputSlot> inputs) {
  if (spec.micro_batches_per_step < 1)
    throw std::invalid_argument("Dataset: micro_batches_per_step " + std::to_string(spec.micro_batches_per_step));
  std::unique_ptr<Dataset> data;
  if (spec.format == DataFormat::Tokens) data = std::make_unique<TokenDataset>(spec, std::move(inputs));
  else data = std::make_unique<NpyDataset>(spec, std::move(inputs));
  data->micro_batches_per_step_ = spec.micro_batches_per_step;
  return data;
}

void Dataset::check_micro_batch(int64_t micro_batch) const {
  if (micro_batch < 0 || micro_batch >= micro_batches_per_step_)
    throw std::invalid_argument("Dataset: micro-batch " + std::to_string(micro_batch) + " of " +
                                std::to_string(micro_batches_per_step_));
}

}  // namespace napkin::runtime
