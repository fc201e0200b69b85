#include "runtime/sampler.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <numeric>

#include "runtime/checkpoint.h"
#include "runtime/sharded_checkpoint.h"
#include "runtime/npy.h"
#include "runtime/error.h"
#include "runtime/flag_checks.h"
#include "runtime/tensor_element.h"
#include "runtime/token_text.h"

namespace napkin::runtime {

int64_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k, Rng& rng) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  if (temperature <= 0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  // Largest first; equal logits by id, so the kept set does not depend on the sort.
  auto larger = [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  const int64_t keep = top_k > 0 && top_k < vocab ? top_k : vocab;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), larger);
  order.resize(static_cast<size_t>(keep));
  std::sort(order.begin(), order.end());  // draw over the kept ids in id order
  // Weights exp((logit - top) / T), top the largest kept logit: no exponent
  // is above 0 and none is computed as a difference of overflowed quotients,
  // so any temperature > 0 works; a tiny one leaves the largest logits alone
  // with weight 1 (greedy, ties drawn uniformly).
  double top = -std::numeric_limits<double>::infinity();
  for (int64_t id : order) top = std::max(top, logits[id]);
  std::vector<double> weight(order.size());
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += weight[i] = std::exp((logits[order[i]] - top) / temperature);
  const double u = rng.uniform01() * sum;
  double acc = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    acc += weight[i];
    if (u < acc) return order[i];
  }
  return order.back();
}

namespace {

// The sampler's flags.
struct Options {
  std::string checkpoint, prompt, prompt_ids, logits, tokenizer;
  bool has_prompt = false;
  SampleOptions sample;
  int threads = 0;
};

// The tensors of an inference program (passes/derive_inference.h).
struct Tensors {
  const TensorSpec *prefill_tokens, *prefill_positions, *prefill_logits;
  const TensorSpec *decode_tokens, *decode_positions, *decode_logits;
  explicit Tensors(const Program& p)
      : prefill_tokens(&need(p, "prefill.tokens")),
        prefill_positions(&need(p, "prefill.positions")),
        prefill_logits(&need(p, "prefill.logits")),
        decode_tokens(&need(p, "decode.tokens")),
        decode_positions(&need(p, "decode.positions")),
        decode_logits(&need(p, "decode.logits")) {}
  static const TensorSpec& need(const Program& p, const char* name) {
    const TensorSpec* t = p.find(name);
    if (!t) throw Error(fmt::format("the program of {} is not an inference program: it has no tensor {}", p.model, name));
    return *t;
  }
  int64_t batch() const { return prefill_tokens->shape.at(0); }
  int64_t context() const { return prefill_tokens->shape.at(1); }
  int64_t vocab() const { return prefill_logits->shape.back(); }
};

// Loads every parameter from `path` (checkpoint.h read_model_weights) and
// says where they came from.
std::string load_parameters(const Program& p, Engine& engine, const std::string& path) {
  std::vector<TensorRef> params;
  for (const TensorSpec* t : p.with_role(TensorRole::Param)) params.push_back({t->name, std::string(dtype_name(t->dtype)), t->shape, engine.host(*t)});
  const StepBuild built{p.train.dims, p.train.memory_budget};
  const std::optional<CheckpointHeader> h = read_model_weights(
      path, params, p.hash,
      "the sampler is this model at the --dims (and --memory-budget) `napkin sample` was given: the ones the "
      "checkpoint's run was trained with",
      &built);
  engine.upload(TensorRole::Param);
  return h ? fmt::format("{} (step {})", path, h->step) : path;
}

// --checkpoint PATH: the file PATH, or the newest checkpoint in the
// directory PATH, loaded. When that newest one cannot be used, the message
// lists the older ones there that can.
std::string load_checkpoint(const Program& p, Engine& engine, const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found)
    throw Error(fmt::format("no checkpoint at {}: train the model first (napkin train MODEL.yaml) or pass "
                            "--checkpoint FILE_OR_DIR", path));
  if (ec)  // a loop of symbolic links, a directory on the way it may not search
    throw Error(fmt::format("--checkpoint {}: {}", path, ec.message()));
  if (!std::filesystem::is_directory(status) || is_sharded_checkpoint(path)) return load_parameters(p, engine, path);
  const auto all = list_checkpoints(path);
  if (all.empty()) throw Error(fmt::format("no checkpoint in {}: train the model first (napkin train MODEL.yaml)", path));
  try {
    return load_parameters(p, engine, all.front().second);
  } catch (const Error& e) {
    const std::vector<std::string> good = older_usable_checkpoints(all, p.hash);
    std::string message = fmt::format("{}\n  the newest checkpoint in {} cannot be used; ", e.what(), path);
    if (good.empty()) throw Error(message + "no older one there loads either");
    message += "older ones that load:";
    for (const std::string& g : good) message += "\n    " + g;
    throw Error(message + "\n  to sample from the newest good one: --checkpoint " + good.front());
  }
}

// The prompt's token ids: --prompt's text (its bytes, or a tokenizer's ids:
// TokenText) or the ids in --prompt-ids, a regular file read no further than
// `context` ids.
std::vector<int64_t> prompt_tokens(const Options& o, int64_t vocab, int64_t context, const TokenText& text) {
  std::vector<int64_t> ids;
  if (!o.prompt_ids.empty()) {
    std::error_code ec;
    const std::filesystem::file_status status = std::filesystem::status(o.prompt_ids, ec);
    if (std::filesystem::is_directory(status))
      throw Error(fmt::format("--prompt-ids {}: is a directory: give a file of whitespace-separated token ids",
                              o.prompt_ids));
    if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))  // /dev/zero, a pipe: no end
      throw Error(fmt::format("--prompt-ids {}: is not a regular file: give a file of whitespace-separated token ids",
                              o.prompt_ids));
    std::ifstream in(o.prompt_ids);
    if (!in) throw Error(fmt::format("--prompt-ids {}: cannot read it ({})", o.prompt_ids, std::strerror(errno)));
    // A token id has at most 19 digits: a longer word is read in parts, the
    // first of which is refused, so no word grows without bound.
    constexpr int kLongestId = 24;
    std::string word;
    while (in >> std::setw(kLongestId) >> word) {
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(word, &used);
        if (used != word.size()) id = -1;
      } catch (const std::exception&) {
        id = -1;
      }
      if (id < 0 || id >= vocab)
        throw Error(fmt::format("--prompt-ids {}: token {} ('{}') is not an id of the vocabulary [0, {})", o.prompt_ids,
                                ids.size(), printable(word, kLongestId), vocab));
      if (static_cast<int64_t>(ids.size()) == context)
        throw Error(fmt::format("--prompt-ids {}: the prompt has more than {} tokens, more than the model's context "
                                "of {}: give at most {}", o.prompt_ids, context, context, context));
      ids.push_back(id);
    }
    if (ids.empty()) throw Error(fmt::format("--prompt-ids {}: no token ids in it", o.prompt_ids));
    return ids;
  }
  if (o.has_prompt && o.prompt.empty())
    throw Error("--prompt is empty: give at least one character (the default is a newline, or a tokenizer's "
                "<|endoftext|>)");
  return text.encode(o.prompt, o.has_prompt);
  return ids;
}

// Row `row` of batch entry b of a logits tensor [B, rows, V], as doubles.
std::vector<double> logits_row(Engine& engine, const TensorSpec& t, int64_t b, int64_t row) {
  const int64_t rows = t.shape.at(1), vocab = t.shape.at(2);
  const char* base = engine.host(t);
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int64_t v = 0; v < vocab; ++v) out[v] = read_element(base, t.dtype, (b * rows + row) * vocab + v);
  return out;
}

// Seconds of kernels [first, last) as napkin's time model predicts them (the
// program's per-kernel predictions), or -1 where some kernel has none.
double predicted_seconds(const Program& p, size_t first, size_t last) {
  double s = 0;
  for (size_t i = first; i < last; ++i) {
    if (p.kernels[i].predicted_seconds < 0) return -1;
    s += p.kernels[i].predicted_seconds;
  }
  return s;
}
double predicted_decode_seconds(const Program& p) {
  return predicted_seconds(p, static_cast<size_t>(p.num_forward_kernels), p.kernels.size());
}
double predicted_prefill_seconds(const Program& p) {
  return predicted_seconds(p, static_cast<size_t>(p.num_setup_kernels), static_cast<size_t>(p.num_forward_kernels));
}

// One generation: the state of every batch entry's sequence and the cache's window.
class Generation {
 public:
  Generation(Engine& engine, const SampleOptions& o, const std::function<void(int64_t)>& on_token)
      : engine_(engine), t_(engine.program()), o_(o), on_token_(on_token) {
    for (int64_t b = 0; b < t_.batch(); ++b) rngs_.emplace_back(o.seed, static_cast<uint64_t>(b));
  }

  Generated run(const std::vector<int64_t>& prompt) {
    if (prompt.empty() || static_cast<int64_t>(prompt.size()) > t_.context())
      throw Error(fmt::format("the prompt has {} tokens: it needs 1 to the model's context of {}", prompt.size(),
                              t_.context()));
    out_.sequences.assign(static_cast<size_t>(t_.batch()), prompt);
    // What the parameters and constants alone give, which both the prefill
    // and a decode step read: once, for the weights that are up now.
    engine_.run_setup();
    auto t0 = std::chrono::steady_clock::now();
    out_.prompt_by_steps = ingest(static_cast<int64_t>(prompt.size()));
    if (o_.keep_prompt_logits) keep_prompt_logits(static_cast<int64_t>(prompt.size()));
    out_.prefill_seconds = seconds_since(t0);
    for (int64_t n = 1; n < o_.tokens; ++n) {
      // The token just sampled sits at this position of the window the cache
      // holds; the cache holds the rows before it.
      const int64_t position = static_cast<int64_t>(out_.sequences[0].size()) - 1 - window_start_;
      if (position >= t_.context()) {  // the cache is full: its last half in again
        const int64_t keep = std::max<int64_t>(1, t_.context() / 2);
        ingest(keep);
        window_start_ = static_cast<int64_t>(out_.sequences[0].size()) - 1 - keep;
        ++out_.windows;
        continue;
      }
      auto t = std::chrono::steady_clock::now();
      decode(position, 0);
      take_next(*t_.decode_logits, 0);
      out_.decode_seconds += seconds_since(t);
      ++out_.decode_steps;
    }
    return std::move(out_);
  }

 private:
  Engine& engine_;
  Tensors t_;
  const SampleOptions& o_;
  const std::function<void(int64_t)>& on_token_;
  std::vector<Rng> rngs_;
  Generated out_;
  int64_t window_start_ = 0;  // the sequence's index of the cache's position 0

  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  // The last `length` tokens of each sequence into the cache from position
  // 0, and the next token from their last logits: by the prefill program,
  // or by `length` decode steps; returns whether by steps.
  bool ingest(int64_t length) {
    bool steps = o_.prompt_path == PromptPath::Steps && !o_.keep_prompt_logits;
    if (o_.prompt_path == PromptPath::Auto && !o_.keep_prompt_logits) {
      const double prefill = predicted_prefill_seconds(engine_.program()), step = predicted_decode_seconds(engine_.program());
      steps = prefill > 0 && step > 0 && static_cast<double>(length) * step < prefill;
    }
    if (!steps) {
      prefill_tail(length);
      take_next(*t_.prefill_logits, length - 1);
      return false;
    }
    for (int64_t i = 0; i < length; ++i) decode(i, length - 1 - i);
    take_next(*t_.decode_logits, 0);
    return true;
  }

  // Batch entry 0's prefill logits at positions [0, length).
  void keep_prompt_logits(int64_t length) {
    const TensorSpec& t = *t_.prefill_logits;
    const int64_t vocab = t.shape.at(2);
    out_.prompt_logits.reserve(static_cast<size_t>(length * vocab));
    for (int64_t row = 0; row < length; ++row)
      for (double v : logits_row(engine_, t, 0, row)) out_.prompt_logits.push_back(static_cast<float>(v));
  }

  // The prefill over the last `length` tokens of each sequence.
  void prefill_tail(int64_t length) {
    const int64_t T = t_.context();
    char* tokens = engine_.host(*t_.prefill_tokens);
    char* positions = engine_.host(*t_.prefill_positions);
    for (int64_t b = 0; b < t_.batch(); ++b) {
      const auto& s = out_.sequences[b];
      const int64_t start = static_cast<int64_t>(s.size()) - length;
      for (int64_t i = 0; i < T; ++i)
        write_element(tokens, t_.prefill_tokens->dtype, b * T + i, static_cast<double>(i < length ? s[start + i] : 0));
    }
    for (int64_t i = 0; i < T; ++i) write_element(positions, t_.prefill_positions->dtype, i, static_cast<double>(i));
    engine_.run_forward();
    engine_.download_tensor(*t_.prefill_logits);
  }

  // One decode step at `position` of each sequence's token `back` from its end (0: the last).
  void decode(int64_t position, int64_t back) {
    char* tokens = engine_.host(*t_.decode_tokens);
    for (int64_t b = 0; b < t_.batch(); ++b) {
      const auto& s = out_.sequences[b];
      write_element(tokens, t_.decode_tokens->dtype, b, static_cast<double>(s[s.size() - 1 - static_cast<size_t>(back)]));
    }
    write_element(engine_.host(*t_.decode_positions), t_.decode_positions->dtype, 0, static_cast<double>(position));
    engine_.run_decode();
    engine_.download_tensor(*t_.decode_logits);
  }

  // Samples each sequence's next token from row `row` of `logits`.
  void take_next(const TensorSpec& logits, int64_t row) {
    for (int64_t b = 0; b < t_.batch(); ++b) {
      const int64_t id = sample_token(logits_row(engine_, logits, b, row), o_.temperature, o_.top_k, rngs_[b]);
      out_.sequences[b].push_back(id);
      if (b == 0 && on_token_) on_token_(id);
    }
  }
};

// A token on stdout, as it comes.
void print_token(TokenText& text, int64_t id) {
  const std::string piece = text.piece(id);
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

Generated generate(Engine& engine, const std::vector<int64_t>& prompt, const SampleOptions& o,
                   const std::function<void(int64_t)>& on_token) {
  return Generation(engine, o, on_token).run(prompt);
}

TrainingSamples::TrainingSamples(const char* json, size_t size, const EngineFactory& make_engine, int threads,
                                 const std::string& tokenizer)
    : program_(parse_program(json, size)),
      engine_(make_engine(program_, threads)),
      text_(std::make_unique<TokenText>(Tensors(program_).vocab(), tokenizer)) {}

TrainingSamples::~TrainingSamples() = default;

std::string TrainingSamples::sample(Engine& training, int64_t tokens, uint64_t seed) {
  training.download(TensorRole::Param);
  for (const TensorSpec* t : program_.with_role(TensorRole::Param)) {
    const TensorSpec* from = training.program().find(t->name);
    if (!from || from->bytes != t->bytes || from->dtype != t->dtype)
      throw Error(fmt::format("the trainer's sampler program has a parameter {} the training step does not", t->name));
    std::memcpy(engine_->host(*t), training.host(*from), static_cast<size_t>(t->bytes));
  }
  engine_->upload(TensorRole::Param);
  const std::vector<int64_t> start = text_->is_text() ? text_->encode("", false) : std::vector<int64_t>{0};
  const Generated g = generate(*engine_, start, {tokens, 1.0, 0, seed});
  std::string text;
  for (size_t i = start.size(); i < g.sequences[0].size(); ++i) text += text_->piece(g.sequences[0][i]);
  if (!text.empty() && text.back() == ' ' && !text_->is_text()) text.pop_back();
  return text;
}

int sampler_main(int argc, char** argv, const Program& program, const EngineFactory& make_engine) {
  try {
    Options o;
    o.checkpoint = program.train.checkpoint_dir;
    CLI::App app{fmt::format("napkin sampler for {} (generated by napkin sample)", program.model)};
    app.add_option("--checkpoint", o.checkpoint, "a checkpoint file, or a directory: its newest checkpoint")
        ->capture_default_str();
    o.tokenizer = program.train.data.tokenizer;
    CLI::Option* prompt = app.add_option(
        "--prompt", o.prompt,
        "text to continue (byte-level models, or with a tokenizer; default: a newline, or the tokenizer's "
        "<|endoftext|>)");
    app.add_option("--tokenizer", o.tokenizer,
                   "the tokenizer.json the model's data was encoded with: --prompt is encoded and the output decoded "
                   "by it (default: the model's train.data.tokenizer)")
        ->capture_default_str();
    app.add_option("--prompt-ids", o.prompt_ids, "a file of whitespace-separated token ids to continue")->excludes(prompt);
    app.add_option("--tokens", o.sample.tokens, "tokens to generate")->check(whole_number_in(1, 1'000'000))->capture_default_str();
    app.add_option("--temperature", o.sample.temperature, "softmax temperature (0: greedy)")
        ->check(number_in(0, 100))->capture_default_str();
    app.add_option("--top-k", o.sample.top_k, "sample from the k most likely tokens only (0: all)")
        ->check(whole_number_in(0, 1'000'000'000))->capture_default_str();
    app.add_option("--seed", o.sample.seed, "seed of the sampling draws")->check(whole_number_in(0, UINT64_MAX))->capture_default_str();
    std::string prompt_path = "auto";
    app.add_option("--prompt-path", prompt_path,
                   "how the prompt enters the KV cache: prefill (the whole-context program), steps (a decode step a "
                   "token) or auto (whichever napkin's time model predicts faster)")
        ->check(CLI::IsMember({"auto", "prefill", "steps"}))->capture_default_str();
    app.add_option("--threads", o.threads, "worker threads (0: the CPUs this process may use)")
        ->check(whole_number_in(0, 1024))->capture_default_str();
    app.add_option("--logits", o.logits,
                   "write the logits at every prompt position (the first sequence's) to this .npy file, f32 "
                   "[prompt tokens, vocab]; the prompt goes in by the prefill");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // --help is a success; every mistake in the flags is a user error (1),
      // whatever code CLI11 gives its kind of error, as the trainer's.
      return app.exit(e) == 0 ? 0 : 1;
    }
    o.has_prompt = prompt->count() > 0;
    o.sample.keep_prompt_logits = !o.logits.empty();
    o.sample.prompt_path = prompt_path == "prefill" ? PromptPath::Prefill
                           : prompt_path == "steps" ? PromptPath::Steps
                                                    : PromptPath::Auto;

    std::unique_ptr<Engine> engine = make_engine(program, o.threads);
    const Tensors t(program);
    const int64_t vocab = t.vocab();
    TokenText text(vocab, o.tokenizer);
    const std::vector<int64_t> prompt_ids = prompt_tokens(o, vocab, t.context(), text);
    if (static_cast<int64_t>(prompt_ids.size()) > t.context())
      throw Error(fmt::format("the prompt has {} tokens, more than the model's context of {}", prompt_ids.size(),
                              t.context()));
    const std::string loaded = load_checkpoint(program, *engine, o.checkpoint);
    std::fprintf(stderr, "napkin sample: %s on %s, weights from %s\n", program.model.c_str(), engine->describe().c_str(),
                 loaded.c_str());
    std::fflush(stderr);

    for (int64_t id : prompt_ids) print_token(text, id);
    const Generated s = generate(*engine, prompt_ids, o.sample, [&](int64_t id) { print_token(text, id); });
    std::fputc('\n', stdout);
    if (!o.logits.empty()) {
      const int64_t rows = static_cast<int64_t>(prompt_ids.size());
      write_npy(o.logits, "<f4", {rows, vocab}, s.prompt_logits.data(), s.prompt_logits.size() * sizeof(float));
    }
    for (size_t b = 1; b < s.sequences.size(); ++b) {
      std::fprintf(stdout, "--- sample %zu of %zu ---\n", b + 1, s.sequences.size());
      for (int64_t id : s.sequences[b]) print_token(text, id);
      std::fputc('\n', stdout);
    }
    std::fflush(stdout);
    // Decode speed against the time model's prediction for the same kernels.
    std::string speed = "no decode steps";
    if (s.decode_steps > 0) {
      const double per_step = s.decode_seconds / static_cast<double>(s.decode_steps);
      const double batch = static_cast<double>(t.batch());
      speed = fmt::format("decode {} steps of batch {} in {:.3f} s, {:.1f} tok/s", s.decode_steps, t.batch(),
                          s.decode_seconds, batch / per_step);
      if (const double predicted = predicted_decode_seconds(program); predicted > 0)
        speed += fmt::format(" (napkin's roofline on {}: {:.0f} tok/s; measured {:.0f}% of it; docs/report.md#inference)",
                             program.device, batch / predicted, 100.0 * predicted / per_step);
    }
    if (s.windows > 0)
      speed += fmt::format("; the context was full {} time{}: its last half went in again", s.windows,
                           s.windows == 1 ? "" : "s");
    const std::string prompt_line =
        s.prompt_by_steps
            ? fmt::format("the prompt ({} tokens) by {} decode steps in {:.1f} ms", prompt_ids.size(), prompt_ids.size(),
                          1e3 * s.prefill_seconds)
            : fmt::format("the prompt ({} tokens) by the prefill of {} positions in {:.1f} ms", prompt_ids.size(),
                          t.context(), 1e3 * s.prefill_seconds);
    std::fprintf(stderr, "napkin sample: %s; %s\n", prompt_line.c_str(), speed.c_str());
    if (text.unknown_ids() > 0)
      std::fprintf(stderr,
                   "napkin sample: %lld sampled ids are beyond the tokenizer's vocabulary (%s) and printed as "
                   "<|id N|>: the model's vocabulary of %lld is padded past it\n",
                   static_cast<long long>(text.unknown_ids()), text.tokenizer_path().c_str(),
                   static_cast<long long>(vocab));
    return 0;
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nerror: %s\n", e.what());
    return 1;
  }
}

}  // namespace napkin::runtime
