#include "tools/bpe_train.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <string_view>
#include <unordered_map>

#include "runtime/checkpoint.h"  // printable
#include "runtime/error.h"
#include "runtime/mapped_file.h"
#include "runtime/pretokenize.h"
#include "runtime/thread_pool.h"
#include "runtime/tokenizer.h"
#include "runtime/unicode_classes.h"

namespace napkin::tools {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A 64-bit hash of a short byte string (pre-tokens average a few bytes), 8
// bytes at a time; its low bits pick a slot, its high bits a shard.
uint64_t hash_bytes(std::string_view s) {
  const char* p = s.data();
  size_t n = s.size();
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0x94d049bb133111ebull;
    h ^= h >> 29;
  }
  h *= 0xd6e8feb86659fd93ull;
  return h ^ (h >> 32);
}

// Bytes that outlive the mapped corpus: each distinct pre-token is copied
// here when first counted, so the corpus's pages can be let go as soon as
// they are counted.
class ByteArena {
 public:
  const char* copy(std::string_view bytes) {
    if (bytes.size() > free_) {
      size_t size = std::max(kBlock, bytes.size());
      blocks_.push_back(std::make_unique<char[]>(size));
      next_ = blocks_.back().get();
      free_ = size;
    }
    char* out = next_;
    std::memcpy(out, bytes.data(), bytes.size());
    next_ += bytes.size();
    free_ -= bytes.size();
    return out;
  }

 private:
  static constexpr size_t kBlock = size_t{1} << 20;
  std::vector<std::unique_ptr<char[]>> blocks_;
  char* next_ = nullptr;
  size_t free_ = 0;
};

// Counts of distinct pre-tokens, keyed by views into arenas: open
// addressing with linear probing, each slot keeping its key's hash so that
// probes and growth rarely touch the bytes. A count of 0 marks a free slot.
class PieceCounts {
 public:
  struct Slot {
    uint64_t hash = 0;
    const char* data = nullptr;
    size_t size = 0;
    int64_t count = 0;
  };

  PieceCounts() : slots_(64) {}

  // Adds n to the count of `piece`. A piece seen for the first time is
  // copied into `arena` when one is given (else the slot keeps the view).
  void add(std::string_view piece, uint64_t hash, int64_t n, ByteArena* arena) {
    size_t mask = slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.count == 0) {
        s = {hash, arena ? arena->copy(piece) : piece.data(), piece.size(), n};
        if (++used_ * 2 > slots_.size()) grow();
        return;
      }
      if (s.hash == hash && s.size == piece.size() && std::memcmp(s.data, piece.data(), piece.size()) == 0) {
        s.count += n;
        return;
      }
    }
  }

  const std::vector<Slot>& slots() const { return slots_; }
  size_t size() const { return used_; }

 private:
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.count == 0) continue;
      size_t i = s.hash & mask;
      while (slots_[i].count != 0) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  size_t used_ = 0;
};

// Each counting thread's pre-token counts, split by the hash's top bits into
// shards so that the threads' counts merge in parallel, one shard per task.
constexpr int kShardBits = 6;
constexpr int kShards = 1 << kShardBits;
struct ShardedCounts {
  std::vector<PieceCounts> shards = std::vector<PieceCounts>(kShards);
  ByteArena arena;

  void count(std::string_view piece) {
    uint64_t h = hash_bytes(piece);
    shards[h >> (64 - kShardBits)].add(piece, h, 1, &arena);
  }
};

// Every distinct pre-token of the corpus with its count, by shard.
struct PretokenCounts {
  std::vector<PieceCounts> shards;
  std::vector<ShardedCounts> threads;  // the arenas the shards' keys point into
};

// Lets the kernel take back the pages of `text` (a stretch of a read-only
// mapping, all counted): they are read from the file again if touched, so
// this only keeps the corpus out of the resident set.
void release_pages(std::string_view text) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uintptr_t begin = (reinterpret_cast<uintptr_t>(text.data()) + page - 1) & ~(page - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(text.data()) + text.size()) & ~(page - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// Calls fn(text) for each stretch of `region` between special tokens.
template <typename Fn>
void for_each_ordinary_text(std::string_view region, const std::vector<tokenizer::SpecialToken>& specials, Fn&& fn) {
  tokenizer::SpecialFinder finder(region, specials);
  size_t at = 0;
  for (tokenizer::SpecialFinder::Found f = finder.next(0); f.special; f = finder.next(at)) {
    fn(region.substr(at, f.at - at));
    at = f.at + f.special->text.size();
  }
  fn(region.substr(at));
}

// Prints progress lines: in place on a terminal (twice a second), else a line
// every 2 seconds.
class ProgressLine {
 public:
  explicit ProgressLine(const BpeProgress& p) : p_(p) {}

  bool due() const { return p_.out && seconds_since(last_) >= (p_.terminal ? 0.5 : 2.0); }

  void show(const std::string& text) {
    last_ = Clock::now();
    if (p_.terminal) {
      *p_.out << "\r" << text << "\033[K" << std::flush;
      shown_ = true;
    } else {
      *p_.out << text << "\n" << std::flush;
    }
  }

  // Clears the in-place line, if any.
  void done() {
    if (shown_) *p_.out << "\r\033[K" << std::flush;
    shown_ = false;
  }

  static std::string eta(double elapsed, double done_fraction) {
    if (done_fraction <= 0) return "";
    return fmt::format(", ETA {:.0f} s", elapsed * (1 - done_fraction) / done_fraction);
  }

 private:
  BpeProgress p_;
  Clock::time_point last_ = Clock::now();
  bool shown_ = false;
};

// Counts the pre-tokens of the files in parallel: each counting task takes a
// region, a stretch of one file cut only at safe cuts that no special token
// crosses.
PretokenCounts count_pretokens(const std::vector<runtime::MappedFile>& files,
                               const std::vector<tokenizer::SpecialToken>& specials, int threads,
                               ProgressLine& progress) {
  int64_t total = 0;
  for (const runtime::MappedFile& f : files) total += static_cast<int64_t>(f.size());
  // About 16 regions per thread for balance, none under 256 KiB.
  size_t region_bytes = std::max<size_t>(size_t{256} << 10, static_cast<size_t>(total) / (size_t(threads) * 16) + 1);
  std::vector<std::string_view> regions;
  for (const runtime::MappedFile& f : files) {
    std::string_view text(f.data(), f.size());
    if (text.empty()) continue;
    size_t begin = 0;
    for (size_t cut : tokenizer::safe_cuts(text, (text.size() + region_bytes - 1) / region_bytes)) {
      if (tokenizer::crosses_special(text, cut, specials)) continue;
      regions.push_back(text.substr(begin, cut - begin));
      begin = cut;
    }
    regions.push_back(text.substr(begin));
  }

  runtime::ThreadPool pool(threads);
  PretokenCounts out;
  out.threads.resize(static_cast<size_t>(pool.num_threads()));
  std::vector<ShardedCounts>& counts = out.threads;
  std::atomic<size_t> next_region{0};
  std::atomic<int64_t> bytes_done{0};
  Clock::time_point start = Clock::now();
  // One chunk per worker (worker 0 is this thread, which alone prints);
  // each takes the next region until none is left.
  pool.parallel_for(pool.num_threads(), [&](int64_t worker, int64_t) {
    ShardedCounts& mine = counts[static_cast<size_t>(worker)];
    for (size_t r; (r = next_region.fetch_add(1)) < regions.size();) {
      for_each_ordinary_text(regions[r], specials, [&](std::string_view text) {
        tokenizer::for_each_piece(text, [&](std::string_view piece) { mine.count(piece); });
      });
      release_pages(regions[r]);
      int64_t done = bytes_done += static_cast<int64_t>(regions[r].size());
      if (worker == 0 && progress.due())
        progress.show(fmt::format("bpe: counting pre-tokens, {:.1f} of {:.1f} MB{}", done / 1e6, total / 1e6,
                                  ProgressLine::eta(seconds_since(start), double(done) / double(total))));
    }
  });
  for (const runtime::MappedFile& f : files) f.check_intact();

  // Shard s of every thread into shard s of the first (keys stay in the
  // arenas they were copied to).
  out.shards.resize(kShards);
  pool.parallel_for(kShards, [&](int64_t begin, int64_t end) {
    for (size_t s = static_cast<size_t>(begin); s < static_cast<size_t>(end); ++s) {
      PieceCounts& merged = out.shards[s];
      merged = std::move(counts[0].shards[s]);
      for (size_t t = 1; t < counts.size(); ++t) {
        for (const PieceCounts::Slot& slot : counts[t].shards[s].slots())
          if (slot.count != 0) merged.add({slot.data, slot.size}, slot.hash, slot.count, nullptr);
        counts[t].shards[s] = PieceCounts();
      }
    }
  });
  return out;
}

// The merge loop's state: the distinct pre-tokens as sequences of token ids,
// and for every adjacent pair of tokens its count and the pre-tokens it
// occurs in.
class Merger {
 public:
  explicit Merger(const std::vector<PieceCounts>& pieces) {
    for (int b = 0; b < 256; ++b) token_bytes_.emplace_back(1, static_cast<char>(b));
    for (const PieceCounts& shard : pieces)
      for (const PieceCounts::Slot& s : shard.slots()) {
        if (s.count == 0) continue;
        words_.push_back({static_cast<int64_t>(symbols_.size()), static_cast<int64_t>(s.size), s.count});
        for (size_t i = 0; i < s.size; ++i) symbols_.push_back(static_cast<unsigned char>(s.data[i]));
        pretokens_ += s.count;
      }
    if (words_.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
      throw runtime::Error(fmt::format("the corpus has {} distinct pre-tokens, more than napkin's BPE trainer takes ({})",
                                       words_.size(), std::numeric_limits<int32_t>::max()));
    word_stamp_.assign(words_.size(), -1);
    // Stamp -1: every pair is "touched" by the initial count, and the heap
    // starts with all of them.
    for (size_t w = 0; w < words_.size(); ++w) {
      const int32_t* s = &symbols_[static_cast<size_t>(words_[w].begin)];
      for (int64_t i = 0; i + 1 < words_[w].size; ++i) add_pair(s[i], s[i + 1], words_[w].count, static_cast<int32_t>(w));
    }
    push_touched();
  }

  int64_t unique_pretokens() const { return static_cast<int64_t>(words_.size()); }
  int64_t pretokens() const { return pretokens_; }

  // Merges the most frequent pair; returns false when no pair is left.
  // `merged` gets the pair's byte strings, `new_token` whether the merged
  // bytes made a new token.
  bool merge_next(std::pair<std::string, std::string>& merged, bool& new_token) {
    int32_t p = pop_max();
    if (p < 0) return false;
    int32_t a = pair_left_[static_cast<size_t>(p)], b = pair_right_[static_cast<size_t>(p)];
    merged = {token_bytes_[static_cast<size_t>(a)], token_bytes_[static_cast<size_t>(b)]};
    std::string bytes = merged.first + merged.second;
    auto [it, inserted] = merged_ids_.emplace(bytes, static_cast<int32_t>(token_bytes_.size()));
    new_token = inserted;
    if (inserted) token_bytes_.push_back(std::move(bytes));
    int32_t x = it->second;

    ++stamp_;
    std::vector<int32_t> words = std::move(pair_words_[static_cast<size_t>(p)]);
    pair_words_[static_cast<size_t>(p)] = {};
    for (int32_t w : words) {
      if (word_stamp_[static_cast<size_t>(w)] == stamp_) continue;
      word_stamp_[static_cast<size_t>(w)] = stamp_;
      merge_in_word(w, p, a, b, x);
    }
    push_touched();
    return true;
  }

 private:
  struct Word {
    int64_t begin;  // in symbols_
    int64_t size;
    int64_t count;  // occurrences in the corpus
  };
  struct HeapEntry {
    int64_t count;  // the pair's count when pushed: at least its count now, unless the pair was pushed again since
    int32_t pair;
  };

  static uint64_t pair_key(int32_t a, int32_t b) {
    return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
  }

  // Rewrites word w's occurrences of (a, b) as x, left to right, and moves
  // their counts: each occurrence takes the pre-token's count from (a, b),
  // from (left neighbour, a) and (b, right neighbour), and gives it to
  // (left neighbour, x) and (x, right neighbour). The left neighbour is read
  // from the rewritten prefix, so "a b a b" gives (x, x), not (x, a).
  void merge_in_word(int32_t w, int32_t p, int32_t a, int32_t b, int32_t x) {
    Word& word = words_[static_cast<size_t>(w)];
    int32_t* s = &symbols_[static_cast<size_t>(word.begin)];
    int64_t n = word.size, c = word.count, out = 0;
    for (int64_t i = 0; i < n;) {
      if (i + 1 < n && s[i] == a && s[i + 1] == b) {
        pair_count_[static_cast<size_t>(p)] -= c;
        if (out > 0) {
          remove_pair(s[out - 1], a, c);
          add_pair(s[out - 1], x, c, w);
        }
        if (i + 2 < n) {
          remove_pair(b, s[i + 2], c);
          add_pair(x, s[i + 2], c, w);
        }
        s[out++] = x;
        i += 2;
      } else {
        s[out++] = s[i++];
      }
    }
    word.size = out;
  }

  int32_t pair_id(uint64_t key) const {
    size_t mask = index_keys_.size() - 1;
    for (size_t i = slot_of(key, mask);; i = (i + 1) & mask) {
      if (index_keys_[i] == key) return index_ids_[i];
      if (index_keys_[i] == kNoKey) return -1;
    }
  }

  void remove_pair(int32_t a, int32_t b, int64_t c) { pair_count_[static_cast<size_t>(pair_id(pair_key(a, b)))] -= c; }

  // Adds c to pair (a, b)'s count (a new pair if need be), records that
  // word w contains it, and marks it touched by this merge.
  void add_pair(int32_t a, int32_t b, int64_t c, int32_t w) {
    uint64_t key = pair_key(a, b);
    if (index_keys_.empty() || (pair_count_.size() + 1) * 2 > index_keys_.size()) grow_index();
    size_t mask = index_keys_.size() - 1;
    size_t i = slot_of(key, mask);
    while (index_keys_[i] != key && index_keys_[i] != kNoKey) i = (i + 1) & mask;
    if (index_keys_[i] == kNoKey) {
      index_keys_[i] = key;
      index_ids_[i] = static_cast<int32_t>(pair_count_.size());
      pair_count_.push_back(0);
      pair_left_.push_back(a);
      pair_right_.push_back(b);
      pair_words_.emplace_back();
      pair_last_word_.push_back(-1);
      pair_stamp_.push_back(stamp_ - 1);
    }
    size_t p = static_cast<size_t>(index_ids_[i]);
    pair_count_[p] += c;
    if (pair_last_word_[p] != w) {
      pair_words_[p].push_back(w);
      pair_last_word_[p] = w;
    }
    if (pair_stamp_[p] != stamp_) {
      pair_stamp_[p] = stamp_;
      touched_.push_back(static_cast<int32_t>(p));
    }
  }

  static size_t slot_of(uint64_t key, size_t mask) { return static_cast<size_t>((key * 0x9e3779b97f4a7c15ull) >> 29) & mask; }

  void grow_index() {
    size_t capacity = std::max<size_t>(1024, index_keys_.size() * 2);
    std::vector<uint64_t> keys(capacity, kNoKey);
    std::vector<int32_t> ids(capacity, -1);
    for (size_t j = 0; j < index_keys_.size(); ++j) {
      if (index_keys_[j] == kNoKey) continue;
      size_t i = slot_of(index_keys_[j], capacity - 1);
      while (keys[i] != kNoKey) i = (i + 1) & (capacity - 1);
      keys[i] = index_keys_[j];
      ids[i] = index_ids_[j];
    }
    index_keys_.swap(keys);
    index_ids_.swap(ids);
  }

  // Heap order: the greater count, then the lexicographically greater pair
  // of byte strings (left, then right): CS336's tie rule. Bytes compare as
  // unsigned (std::string::compare is memcmp).
  bool less(const HeapEntry& x, const HeapEntry& y) const {
    if (x.count != y.count) return x.count < y.count;
    if (x.pair == y.pair) return false;
    const std::string& xl = token_bytes_[static_cast<size_t>(pair_left_[static_cast<size_t>(x.pair)])];
    const std::string& yl = token_bytes_[static_cast<size_t>(pair_left_[static_cast<size_t>(y.pair)])];
    if (int c = xl.compare(yl); c != 0) return c < 0;
    return token_bytes_[static_cast<size_t>(pair_right_[static_cast<size_t>(x.pair)])] <
           token_bytes_[static_cast<size_t>(pair_right_[static_cast<size_t>(y.pair)])];
  }

  // Queues every pair whose count went up since the last call, with its
  // count now. A pair's count otherwise only goes down, so each pair with a
  // positive count has an entry whose count is at least its own.
  void push_touched() {
    auto cmp = [this](const HeapEntry& x, const HeapEntry& y) { return less(x, y); };
    bool initial = heap_.empty();
    for (int32_t p : touched_)
      if (pair_count_[static_cast<size_t>(p)] > 0) {
        heap_.push_back({pair_count_[static_cast<size_t>(p)], p});
        if (!initial) std::push_heap(heap_.begin(), heap_.end(), cmp);
      }
    if (initial) std::make_heap(heap_.begin(), heap_.end(), cmp);
    touched_.clear();
  }

  // The pair with the greatest (count, bytes), or -1. An entry whose count
  // is above the pair's count now is queued again with the count now; one
  // below it is a leftover (the pair was queued with its higher count).
  int32_t pop_max() {
    auto cmp = [this](const HeapEntry& x, const HeapEntry& y) { return less(x, y); };
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), cmp);
      HeapEntry top = heap_.back();
      heap_.pop_back();
      int64_t now = pair_count_[static_cast<size_t>(top.pair)];
      if (now == top.count && now > 0) return top.pair;
      if (now < top.count && now > 0) {
        heap_.push_back({now, top.pair});
        std::push_heap(heap_.begin(), heap_.end(), cmp);
      }
    }
    return -1;
  }

  static constexpr uint64_t kNoKey = ~uint64_t{0};  // no pair of ids >= 0 has it

  std::vector<std::string> token_bytes_;                     // token id -> bytes
  std::unordered_map<std::string, int32_t> merged_ids_;      // bytes -> id, merged tokens
  std::vector<int32_t> symbols_;                             // the words' token ids, word after word
  std::vector<Word> words_;                                  // the distinct pre-tokens
  std::vector<int32_t> word_stamp_;                          // the last merge that rewrote each word
  int64_t pretokens_ = 0;

  std::vector<uint64_t> index_keys_;                         // pair key -> pair id, open addressing
  std::vector<int32_t> index_ids_;
  std::vector<int64_t> pair_count_;                          // pair id -> occurrences in the corpus
  std::vector<int32_t> pair_left_, pair_right_;              // pair id -> its tokens
  std::vector<std::vector<int32_t>> pair_words_;             // pair id -> words it occurs in (or did)
  std::vector<int32_t> pair_last_word_;                      // the last word added to pair_words_
  std::vector<int32_t> pair_stamp_;                          // the last merge that touched it
  std::vector<int32_t> touched_;                             // pairs whose count went up in this merge
  std::vector<HeapEntry> heap_;
  int32_t stamp_ = -1;                                       // merges done - 1
};

}  // namespace

BpeResult train_bpe(const std::vector<std::string>& corpus, const BpeOptions& options, const BpeProgress& progress_to) {
  Clock::time_point start = Clock::now();
  for (size_t i = 0; i < options.specials.size(); ++i) {
    if (options.specials[i].empty()) throw runtime::Error("--special: a special token cannot be empty");
    // tokenizer.json's vocabulary is keyed by text: a one-byte special token
    // would take the byte's own entry ("a" is byte 0x61's spelling).
    if (options.specials[i].size() == 1)
      throw runtime::Error(fmt::format("--special \"{}\": a special token of one byte would replace that byte's token; "
                                       "use a longer text such as \"<|endoftext|>\"",
                                       options.specials[i]));
    // tokenizer.json is JSON text: a special token's text must be UTF-8.
    for (size_t k = 0; k < options.specials[i].size();) {
      char32_t c;
      k += unicode::decode_utf8(options.specials[i], k, c);
      if (c == unicode::kInvalidByte)
        throw runtime::Error(fmt::format("--special: \"{}\" is not UTF-8 text, which tokenizer.json must hold",
                                         runtime::printable(options.specials[i])));
    }
    for (size_t j = 0; j < i; ++j)
      if (options.specials[j] == options.specials[i])
        throw runtime::Error(fmt::format("--special: \"{}\" is given twice", options.specials[i]));
  }
  int64_t base = 256 + static_cast<int64_t>(options.specials.size());
  if (options.vocab_size < base)
    throw runtime::Error(fmt::format(
        "--vocab {} is too small: the 256 byte tokens{} take {}; ask for more to have merges", options.vocab_size,
        options.specials.empty() ? "" : fmt::format(" and {} special token{}", options.specials.size(),
                                                    options.specials.size() == 1 ? "" : "s"),
        base));

  BpeResult result;
  std::vector<runtime::MappedFile> files;
  for (const std::string& path : corpus) {
    files.emplace_back(path);
    result.corpus_bytes += static_cast<int64_t>(files.back().size());
  }
  int threads = options.threads > 0 ? options.threads : runtime::default_thread_count();
  ProgressLine progress(progress_to);
  std::unique_ptr<Merger> merger;
  {
    // Counting needs only their texts (ids are given after the merges).
    std::vector<tokenizer::SpecialToken> specials;
    for (const std::string& s : options.specials) specials.push_back({s, 0});
    PretokenCounts pieces = count_pretokens(files, specials, threads, progress);
    files.clear();  // the counts hold their own copies of the bytes
    merger = std::make_unique<Merger>(pieces.shards);
  }
  result.pretokens = merger->pretokens();
  result.unique_pretokens = merger->unique_pretokens();
  if (result.pretokens == 0) {
    std::string what = corpus.size() == 1 ? corpus[0] : fmt::format("the corpus ({} files)", corpus.size());
    throw runtime::Error(fmt::format("{} has no text to train on{}", what,
                                     result.corpus_bytes == 0 ? "" : " besides special tokens"));
  }

  int64_t goal = options.vocab_size - base, made = 0;
  Clock::time_point merging = Clock::now();
  std::pair<std::string, std::string> merged;
  bool new_token = false;
  while (made < goal) {
    if (!merger->merge_next(merged, new_token)) {
      result.ran_out = true;
      break;
    }
    result.merges.push_back(std::move(merged));
    if (new_token) ++made;
    if (progress.due())
      progress.show(fmt::format("bpe: merges {} of {}{}", made, goal,
                                ProgressLine::eta(seconds_since(merging), double(made) / double(goal))));
  }
  progress.done();
  result.vocab_size = base + made;
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace napkin::tools
