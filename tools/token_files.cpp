#include "tools/token_files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>

#include "runtime/dataset.h"
#include "runtime/error.h"
#include "runtime/pretokenize.h"
#include "runtime/thread_pool.h"
#include "runtime/tokenizer.h"
#include "tools/files.h"

namespace napkin::tools {

namespace {

using runtime::Error;
using runtime::with_commas;

static_assert(std::endian::native == std::endian::little, "token files are little-endian: ids are written as the host's");

// llm.c's .bin header (dev/data/data_common.py write_datafile; runtime/dataset.cpp reads it): 256 int32s, [0] the
// magic, [1] the version, [2] the token count, the rest 0.
constexpr size_t kLlmcHeaderInts = 256;
constexpr int32_t kLlmcMagicU16 = 20240520, kLlmcVersionU16 = 1;
constexpr int32_t kLlmcMagicU32 = 20240801, kLlmcVersionU32 = 7;
constexpr const char* kEndOfText = "<|endoftext|>";

// Pieces per thread a batch is split into: the threads take pieces as they
// finish, so the threads wait at the end of a batch for at most one small
// piece, and a slow piece (a block of rare words) does not hold the others up.
constexpr size_t kPiecesPerThread = 16;

// Where a text may be cut so that encoding the two sides apart gives the ids
// of encoding it whole: a safe cut of the pre-tokenization (an ASCII
// non-space then an ASCII space or tab) or the start of a special token's text, provided no
// special token's text spans the position (the whole text's encoding would
// match that one). A cut is checked on the text that will be encoded, so
// cutting the rest again stays exact.
class Cuts {
 public:
  // `specials` (the tokenizer's) must outlive it.
  explicit Cuts(const std::vector<tokenizer::SpecialToken>& specials) : specials_(specials) {
    for (const tokenizer::SpecialToken& s : specials) {
      if (s.text.empty()) continue;
      starts_special_[static_cast<unsigned char>(s.text[0])] = true;
      longest_ = std::max(longest_, s.text.size());
    }
  }

  // The last cut in (lowest, text.size() - longest special], or 0 when there
  // is none: more text may follow, and a special token's text that it
  // completes could span a cut nearer the end ("=\n" then "=").
  size_t last(std::string_view text, size_t lowest) const {
    const size_t end = text.size() - std::min(text.size(), std::max<size_t>(longest_, 1) - 1);
    for (size_t pos = end; pos-- > lowest + 1;)
      if (is_cut(text, pos)) return pos;
    return 0;
  }

  // The first cut in [from, text.size()), or text.size() when there is none.
  size_t next(std::string_view text, size_t from) const {
    for (size_t pos = std::max<size_t>(from, 1); pos < text.size(); ++pos)
      if (is_cut(text, pos)) return pos;
    return text.size();
  }

  // More text after a text can make a cut only this close to its end (a
  // special token's text, now whole, starting there): a position further
  // back that is not a cut stays not one.
  size_t unsettled() const { return longest_ + 2; }

 private:
  bool is_cut(std::string_view text, size_t pos) const {
    if (!tokenizer::is_safe_cut(text, pos) &&
        !(starts_special_[static_cast<unsigned char>(text[pos])] && special_at(text, pos)))
      return false;
    return !tokenizer::crosses_special(text, pos, specials_);
  }

  bool special_at(std::string_view text, size_t pos) const {
    for (const tokenizer::SpecialToken& s : specials_)
      if (!s.text.empty() && text.substr(pos).starts_with(s.text)) return true;
    return false;
  }

  const std::vector<tokenizer::SpecialToken>& specials_;
  bool starts_special_[256] = {};
  size_t longest_ = 0;
};

// An input file read front to back.
class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) throw Error(fmt::format("{}: cannot read ({})", path, std::strerror(errno)));
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Reads up to n bytes into dest; fewer only at the end of the file.
  size_t read(char* dest, size_t n) {
    size_t done = 0;
    while (done < n) {
      ssize_t got = ::read(fd_, dest + done, n - done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw Error(fmt::format("{}: cannot read ({})", path_, std::strerror(errno)));
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  std::string path_;
  int fd_;
};

// The token file, written to a temporary file beside it that commit()
// renames over it; a file never committed is removed.
class OutputFile {
 public:
  explicit OutputFile(const std::string& path) : path_(path), temp_(path + ".tmp.XXXXXX") {
    fd_ = ::mkstemp(temp_.data());
    if (fd_ < 0) throw Error(fmt::format("{}: cannot create a temporary file beside it ({})", path, std::strerror(errno)));
  }
  ~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_.c_str());
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t n) { write_at(data, n, -1); }
  // At `offset` (-1: where the last write ended).
  void write_at(const void* data, size_t n, off_t offset) {
    const char* p = static_cast<const char*>(data);
    for (size_t done = 0; done < n;) {
      ssize_t wrote = offset < 0 ? ::write(fd_, p + done, n - done)
                                 : ::pwrite(fd_, p + done, n - done, offset + static_cast<off_t>(done));
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) throw Error(fmt::format("{}: cannot write ({})", temp_, std::strerror(errno)));
      done += static_cast<size_t>(wrote);
    }
  }

  void commit() {
    if (::fchmod(fd_, 0644) != 0) throw Error(fmt::format("{}: cannot chmod ({})", temp_, std::strerror(errno)));
    if (::fsync(fd_) != 0) throw Error(fmt::format("{}: cannot sync ({})", temp_, std::strerror(errno)));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw Error(fmt::format("{}: cannot close ({})", temp_, std::strerror(errno)));
    if (std::rename(temp_.c_str(), path_.c_str()) != 0)
      throw Error(fmt::format("{}: cannot rename {} over it ({})", path_, temp_, std::strerror(errno)));
    committed_ = true;
  }

 private:
  std::string path_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Bytes whose pages are touched only as they are written (a std::vector
// would zero them all first: 16 MiB for a 1 KiB file).
class Bytes {
 public:
  char* data() { return data_.get(); }
  const char* data() const { return data_.get(); }
  // Room for n bytes, keeping the first `keep`.
  void reserve(size_t n, size_t keep) {
    if (n <= capacity_) return;
    const size_t capacity = std::max(n, 2 * capacity_);
    std::unique_ptr<char[]> bigger(new char[capacity]);
    if (keep > 0) std::memcpy(bigger.get(), data_.get(), keep);
    data_ = std::move(bigger);
    capacity_ = capacity;
  }

 private:
  std::unique_ptr<char[]> data_;
  size_t capacity_ = 0;
};

// Text of one document to encode as a unit, with the end-of-text token before it or not.
struct Part {
  std::string_view text;
  bool eot_before;
};

// About a block of text, the parts it is cut into, and the ids of their pieces.
struct Batch {
  Bytes text;  // [0, filled)
  size_t filled = 0;
  std::vector<Part> parts, pieces;
  std::vector<std::vector<int32_t>> ids;  // piece i's ids, their capacity kept from batch to batch
};

// Reads the inputs, one document each, into batches: whole documents, and
// the text of a document still being read up to its last cut, whose rest
// starts the next batch.
class Reader {
 public:
  Reader(const EncodeOptions& o, const Cuts& cuts) : o_(o), cuts_(cuts) {}

  // Fills `next`, starting with the rest of the document that `prev` (the
  // batch before, if any) cut. Returns false when every input has been read.
  bool fill(Batch& next, const Batch* prev) {
    next.parts.clear();
    next.filled = 0;
    if (prev && input_) {
      const size_t rest = prev->filled - doc_begin_;
      next.text.reserve(std::max(rest, o_.block_bytes), 0);
      std::memcpy(next.text.data(), prev->text.data() + doc_begin_, rest);
      next.filled = rest;
    }
    doc_begin_ = 0;
    size_t want = o_.block_bytes;
    for (;;) {
      read_until(next, want);
      if (!input_) return !next.parts.empty();  // every document read is whole
      const std::string_view doc(next.text.data() + doc_begin_, next.filled - doc_begin_);
      const size_t cut = cuts_.last(doc, no_cut_below_);
      const size_t unsettled = cuts_.unsettled();
      if (cut > 0) {
        next.parts.push_back({doc.substr(0, cut), eot_pending_});
        eot_pending_ = false;
        doc_begin_ += cut;
        no_cut_below_ = doc.size() - cut > unsettled ? doc.size() - cut - unsettled : 0;
        return true;
      }
      no_cut_below_ = doc.size() > unsettled ? doc.size() - unsettled : 0;
      if (!next.parts.empty()) return true;  // the whole documents before it go now; it waits for more text
      // No cut in a whole block: read another block onto it. A file without
      // any cut is held whole (in memory bounded by its size, not the corpus's).
      want = next.filled + o_.block_bytes;
    }
  }

  int64_t bytes() const { return bytes_; }

 private:
  // Reads inputs into b until it holds `want` bytes or the inputs end; each
  // document that ends becomes a part.
  void read_until(Batch& b, size_t want) {
    b.text.reserve(want, b.filled);
    while (b.filled < want) {
      if (!input_) {
        if (next_input_ == o_.inputs.size()) return;
        input_.emplace(o_.inputs[next_input_++]);
        doc_begin_ = b.filled;
        eot_pending_ = o_.eot;
        no_cut_below_ = 0;
      }
      const size_t got = input_->read(b.text.data() + b.filled, want - b.filled);
      b.filled += got;
      bytes_ += static_cast<int64_t>(got);
      if (b.filled < want) {  // the end of the file: the document is whole
        b.parts.push_back({std::string_view(b.text.data() + doc_begin_, b.filled - doc_begin_), eot_pending_});
        input_.reset();
        doc_begin_ = b.filled;
      }
    }
  }

  const EncodeOptions& o_;
  const Cuts& cuts_;
  size_t next_input_ = 0;
  std::optional<InputFile> input_;  // the document being read, whose text from doc_begin_ waits for a cut or its end
  size_t doc_begin_ = 0;
  size_t no_cut_below_ = 0;         // its text from doc_begin_ has no cut at or below this offset
  bool eot_pending_ = false;        // its end-of-text token is still to be written
  int64_t bytes_ = 0;
};

// One run of `napkin data encode`, a pipeline of two batches: while the
// threads encode one, a second thread writes the ids of the one before and
// reads the next into its place, so the threads never wait for the files.
class Encoding {
 public:
  Encoding(const EncodeOptions& o, const tokenizer::Tokenizer& t, int32_t eot_id, bool u32, int threads)
      : o_(o), cuts_(t.specials()), bytes_are_ids_(o.tokenizer.empty()), eot_id_(eot_id), u32_(u32), pool_(threads),
        out_(o.output), reader_(o, cuts_) {
    encoders_.reserve(static_cast<size_t>(pool_.num_threads()));
    for (int i = 0; i < pool_.num_threads(); ++i) encoders_.emplace_back(t);
  }

  // Encodes every input into the temporary file and renames it over the output.
  void run() {
    if (o_.llmc) {
      int32_t header[kLlmcHeaderInts] = {};
      header[0] = u32_ ? kLlmcMagicU32 : kLlmcMagicU16;
      header[1] = u32_ ? kLlmcVersionU32 : kLlmcVersionU16;  // [2], the count, is written at the end
      out_.write(header, sizeof header);
    }
    Batch batches[2];
    for (bool more = reader_.fill(batches[0], nullptr), first = true; more; first = false) {
      Batch& now = batches[0];
      Batch& other = batches[1];
      split(now);
      std::future<bool> io = std::async(std::launch::async, [&, first] {
        if (!first) write(other);
        return reader_.fill(other, &now);
      });
      encode(now);
      more = io.get();
      if (more) std::swap(batches[0], batches[1]);
      else write(now);
    }
    if (o_.llmc) {
      if (tokens_ > std::numeric_limits<int32_t>::max())
        throw Error(fmt::format("{}: {} tokens do not fit llm.c's header, which counts them in an int32; write it "
                                "without --llmc, or encode fewer files into each",
                                o_.output, with_commas(tokens_)));
      const int32_t count = static_cast<int32_t>(tokens_);
      out_.write_at(&count, sizeof count, 2 * sizeof(int32_t));
    }
    out_.commit();
  }

  int64_t tokens() const { return tokens_; }
  int64_t bytes() const { return reader_.bytes(); }
  int threads() const { return pool_.num_threads(); }

 private:
  // Splits b's parts at cuts into pieces of about an equal share of the threads' work.
  void split(Batch& b) const {
    size_t total = 0;
    for (const Part& p : b.parts) total += p.text.size();
    const size_t share = std::max<size_t>(1, total / (kPiecesPerThread * static_cast<size_t>(pool_.num_threads())));
    b.pieces.clear();
    for (const Part& p : b.parts) {
      std::string_view rest = p.text;
      bool eot = p.eot_before;
      while (rest.size() > share) {
        const size_t cut = cuts_.next(rest, share);
        if (cut == rest.size()) break;  // no cut after `share`
        b.pieces.push_back({rest.substr(0, cut), eot});
        eot = false;
        rest.remove_prefix(cut);
      }
      b.pieces.push_back({rest, eot});
    }
    if (b.ids.size() < b.pieces.size()) b.ids.resize(b.pieces.size());
  }

  // Encodes b's pieces on the threads, each taking the next piece as it finishes one.
  void encode(Batch& b) {
    std::atomic<size_t> next{0};
    pool_.parallel_for(pool_.num_threads(), [&](int64_t begin, int64_t end) {
      for (int64_t worker = begin; worker < end; ++worker)
        for (size_t i; (i = next.fetch_add(1)) < b.pieces.size();) {
          std::vector<int32_t>& ids = b.ids[i];
          ids.clear();
          if (bytes_are_ids_) {
            for (char c : b.pieces[i].text) ids.push_back(static_cast<unsigned char>(c));
          } else {
            encoders_[static_cast<size_t>(worker)].encode(b.pieces[i].text, ids);
          }
        }
    });
  }

  void write(const Batch& b) {
    if (u32_) write_ids<uint32_t>(b);
    else write_ids<uint16_t>(b);
  }

  // b's ids in order, as T (the vocabulary was checked to fit it).
  template <typename T>
  void write_ids(const Batch& b) {
    size_t count = 0;
    for (size_t i = 0; i < b.pieces.size(); ++i) count += b.ids[i].size() + (b.pieces[i].eot_before ? 1 : 0);
    out_bytes_.reserve(count * sizeof(T), 0);
    T* dest = reinterpret_cast<T*>(out_bytes_.data());
    for (size_t i = 0; i < b.pieces.size(); ++i) {
      if (b.pieces[i].eot_before) *dest++ = static_cast<T>(eot_id_);
      for (int32_t id : b.ids[i]) *dest++ = static_cast<T>(id);
    }
    out_.write(out_bytes_.data(), count * sizeof(T));
    tokens_ += static_cast<int64_t>(count);
  }

  const EncodeOptions& o_;
  const Cuts cuts_;
  // Byte-level tokens (no tokenizer.json): each byte is its id, which is
  // what the Encoder of no merges gives, without pre-tokenizing.
  const bool bytes_are_ids_;
  const int32_t eot_id_;
  const bool u32_;
  runtime::ThreadPool pool_;
  std::vector<tokenizer::Encoder> encoders_;  // one per thread, their caches warm across batches
  OutputFile out_;
  Reader reader_;
  Bytes out_bytes_;
  int64_t tokens_ = 0;
};

// The id --eot writes: the tokenizer's <|endoftext|>, or its only special token.
int32_t end_of_text_id(const EncodeOptions& o, const tokenizer::Tokenizer& t) {
  if (o.tokenizer.empty())
    throw Error("--eot needs a tokenizer with an end-of-text token (--tokenizer tokenizer.json); byte-level tokens have "
                "none");
  if (int32_t id = t.special_id(kEndOfText); id >= 0) return id;
  if (t.specials().size() == 1) return t.specials().front().id;
  std::string names;
  for (const tokenizer::SpecialToken& s : t.specials()) names += (names.empty() ? "" : ", ") + s.text;
  throw Error(fmt::format("--eot: {} has no {} special token{}; train it with --special \"{}\"", o.tokenizer, kEndOfText,
                          names.empty() ? " (it has no special tokens)"
                                        : fmt::format(" and {} others ({}), so which one ends a document is not clear",
                                                      t.specials().size(), names),
                          kEndOfText));
}

}  // namespace

std::optional<EncodeSummary> encode_text_files(const EncodeOptions& o, std::string& error) {
  try {
    std::vector<std::string> read = o.inputs;
    if (!o.tokenizer.empty()) read.push_back(o.tokenizer);
    if (error = output_problem("-o", o.output, read); !error.empty()) return std::nullopt;
    for (const std::string& path : read)  // before opening: opening a FIFO blocks
      if (error = input_problem(path); !error.empty()) return std::nullopt;
    for (const std::string& path : o.inputs) InputFile check(path);
    if (o.dtype != "" && o.dtype != "u16" && o.dtype != "u32")
      throw Error(fmt::format("--dtype {}: token files are u16 or u32", o.dtype));
    if (o.block_bytes == 0) throw Error("the block size must be at least one byte");

    // Without a tokenizer.json, byte-level tokens: the tokenizer of no merges, whose ids are the bytes.
    const tokenizer::Tokenizer t = o.tokenizer.empty() ? tokenizer::Tokenizer::from_merges({}, {})
                                                       : tokenizer::Tokenizer::load(o.tokenizer);
    constexpr int64_t kU16Ids = int64_t{1} << 16;
    const bool u32 = o.dtype == "u32" || (o.dtype.empty() && t.vocab_size() > kU16Ids);
    if (!u32 && t.vocab_size() > kU16Ids)
      throw Error(fmt::format("--dtype u16: {} has {} ids, more than the {} a u16 holds; write --dtype u32", o.tokenizer,
                              with_commas(t.vocab_size()), with_commas(kU16Ids)));
    const int32_t eot_id = o.eot ? end_of_text_id(o, t) : -1;

    const auto start = std::chrono::steady_clock::now();
    const int threads = o.threads > 0 ? o.threads : runtime::default_thread_count();
    std::filesystem::path out(o.output);
    std::error_code ec;
    if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path(), ec);
    Encoding encoding(o, t, eot_id, u32, threads);
    encoding.run();
    EncodeSummary s;
    s.dtype = u32 ? "u32" : "u16";
    s.vocab = t.vocab_size();
    s.tokens = encoding.tokens();
    s.bytes = encoding.bytes();
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    s.threads = encoding.threads();
    return s;
  } catch (const Error& e) {
    error = e.what();
    return std::nullopt;
  }
}

std::string summary_line(const EncodeOptions& o, const EncodeSummary& s) {
  const std::string what = o.tokenizer.empty() ? "byte-level " + s.dtype : s.dtype;
  const std::string files = fmt::format("{} file{}", o.inputs.size(), o.inputs.size() == 1 ? "" : "s");
  const double mb_per_s = s.seconds > 0 ? static_cast<double>(s.bytes) / 1e6 / s.seconds : 0.0;
  const double bytes_per_token = s.tokens > 0 ? static_cast<double>(s.bytes) / static_cast<double>(s.tokens) : 0.0;
  return fmt::format("wrote {}{}: {} {} tokens of {} ({} bytes, {:.2f} bytes/token), {:.1f} MB/s on {} thread{}",
                     o.output, o.llmc ? " (llm.c header)" : "", with_commas(s.tokens), what, files, with_commas(s.bytes),
                     bytes_per_token, mb_per_s, s.threads, s.threads == 1 ? "" : "s");
}

}  // namespace napkin::tools
