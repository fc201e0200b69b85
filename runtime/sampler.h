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
// Sampling: logits / temperature, the top-k kept (0: all), softmax in
// double, then one uniform draw of runtime/rng.h's generator Rng(seed, row)
// per token; --temperature 0 is greedy (the first largest logit). The same
// seed gives the same tokens, on any thread count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/rng.h"
#include "runtime/trainer.h"

namespace napkin::runtime {

// The next token from one row of logits (V values as double).
int64_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k, Rng& rng);

// Runs the sampler; returns the exit status (0, or 1 for a user error: a
// checkpoint of another model, a prompt longer than the context, a byte
// outside the vocabulary, a bad flag).
int sampler_main(int argc, char** argv, const Program& program, const EngineFactory& make_engine);

}  // namespace napkin::runtime
