// `napkin sample`: the main program of an executable built from an inference
// program (passes/derive_inference.h): load a checkpoint's parameters, run
// the prefill over the prompt, then one decode step per new token, each
// reading and extending the KV cache, and print what the model writes.
//
// Tokens: a byte-level model (vocab 256, or less: bytes below it) takes the
// prompt as text and prints text; any other model takes token ids
// (--prompt-ids FILE, whitespace-separated) and prints ids.
//
// The program's tensors: prefill.tokens [B, T] and prefill.positions [T],
// decode.tokens [B, 1] and decode.positions [1], prefill.logits [B, T, V]
// and decode.logits [B, 1, V]. The prompt (P tokens) fills the first P
// positions of the prefill (the rest hold token 0, whose keys later decode
// steps overwrite before any query reads them); the next token comes from
// row P - 1's logits. When the sequence reaches T, the prefill runs again
// over its last T / 2 tokens (a window: the model never saw positions past
// T) and decoding goes on from there.
//
// Sampling: the top-k kept (0: all), softmax of (logit - the largest) /
// temperature in double, which no temperature overflows (a tiny one leaves
// the largest logits alone: greedy, ties drawn), then one uniform draw of
// runtime/rng.h's generator Rng(seed, row) per token; --temperature 0 is
// greedy (the first largest logit); a temperature that is not a finite
// number from 0 to 100 is refused. The same seed gives the same tokens, on
// any thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/rng.h"

namespace napkin::runtime {

// The next token from one row of logits (V values as double).
int64_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k, Rng& rng);

// How a prompt (and a window, when the context is full) enters the cache:
// the prefill program over the whole context, or one decode step per token.
// Auto takes whichever napkin's time model predicts faster for its length
// (a short prompt in a long context: the steps).
enum class PromptPath : uint8_t { Auto, Prefill, Steps };

struct SampleOptions {
  int64_t tokens = 256;      // to generate after the prompt
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: all
  uint64_t seed = 0;
  PromptPath prompt_path = PromptPath::Auto;
  // Keep the prompt's logits (Generated::prompt_logits); the prompt then
  // goes in by the prefill, which computes every position's.
  bool keep_prompt_logits = false;
};

// What a generation did: every batch entry's sequence (the prompt, then the
// new tokens) and how long its phases took.
struct Generated {
  std::vector<std::vector<int64_t>> sequences;
  double prefill_seconds = 0, decode_seconds = 0;  // the prompt's (either path), the new tokens' decode steps
  bool prompt_by_steps = false;                    // the prompt went in by decode steps
  int64_t decode_steps = 0;
  int windows = 0;  // times the context was full and its last half went in again
  // With SampleOptions::keep_prompt_logits: batch entry 0's logits at every
  // prompt position, [prompt length, V] row-major, as f32 (the sampler's
  // --logits FILE.npy: what bench/hf_parity.py compares with transformers').
  std::vector<float> prompt_logits;
};

// Generates o.tokens tokens after `prompt` (1 to context tokens) with an
// inference program's engine whose parameters are up (its setup runs first,
// for those parameters). on_token, when set,
// gets each of batch entry 0's new tokens as it comes.
Generated generate(Engine& engine, const std::vector<int64_t>& prompt, const SampleOptions& o,
                   const std::function<void(int64_t)>& on_token = nullptr);

// The trainer's --sample-every: an inference program's engine, given the
// training engine's current parameters (by name) before each sample.
class TokenText;

class TrainingSamples {
 public:
  // `tokenizer`: the tokenizer.json the samples decode by ("": bytes or ids).
  TrainingSamples(const char* json, size_t size, const EngineFactory& make_engine, int threads,
                  const std::string& tokenizer);
  ~TrainingSamples();
  // `tokens` sampled (temperature 1, all tokens, `seed`) after a newline
  // (byte-level models), the tokenizer's <|endoftext|> or token 0: the text,
  // or the ids joined by spaces.
  std::string sample(Engine& training, int64_t tokens, uint64_t seed);

 private:
  Program program_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<TokenText> text_;
};

// Runs the sampler; returns the exit status (0, or 1 for a user error: a
// checkpoint of another model, a prompt longer than the context, a byte
// outside the vocabulary, a bad flag). --logits FILE.npy writes the prompt's
// logits (Generated::prompt_logits).
int sampler_main(int argc, char** argv, const Program& program, const EngineFactory& make_engine);

}  // namespace napkin::runtime
