// The inference program of a language model (`napkin sample`): from the
// forward graph of a model whose loss is cross_entropy(logits, targets) over
// tokens [batch, seq], a graph of two phases over the same parameters:
//
//   Forward (prefill)  prefill.tokens [batch, T], prefill.positions [T]
//                      -> prefill.logits [batch, T, vocab]
//   Decode             decode.tokens [batch, 1], decode.positions [1]
//                      -> decode.logits [batch, 1, vocab]
//
// and before both a Setup phase (ir::Phase::Setup), run once after the
// parameters load: every kernel that depends on the parameters and
// constants alone (a mixed-precision policy's casts of the weights, rotary
// frequencies, ALiBi slopes, any constant subgraph) runs there, once, and
// both phases read its values, whichever of them runs first: a prompt may
// enter the cache by decode steps alone. The values they read are named
// graph outputs setup.0, setup.1, ... so that they outlive the setup. Views
// and fills (free, or cheaper to make again than to keep) each phase makes
// itself.
//
// T is the model's context (its seq dim). Each phase is the forward graph
// with the sequence axis at T or 1: every node is rebuilt with its seq-sized
// axis (found by the dim's name and size) at the phase's length, arange(seq)
// becomes the phase's positions, and each fused causal attention becomes a
// cached_attention (ir/loop.h CachedAttentionParams) over a key and a value
// cache per layer, State values [batch, kv_heads, T, head_dim] in k's dtype
// that both phases share: the prefill writes rows 0..T-1, a decode step the
// row at its position, and each query reads the rows up to its own position.
// An attention with a fused rope (rope_* attrs, passes/fuse_rope.h) keeps it:
// the cached_attention rotates q and the new k at the phase's positions and
// the caches hold rotated keys.
// A moe() layer (frontend/moe.cpp) is rebuilt at the phase's batch · length
// tokens by its named routing axes (ir::kMoeTokensDim, ...), every token
// routed: its capacity is the phase's token count, since capacity is a
// training device and a sampled token must not depend on the others.
// So a prompt shorter than T is padded: rows past the prompt hold the pad's
// keys until decode steps overwrite them, and no query reads a row past its
// position. Random ops (dropout) are the identity, as in evaluation: their
// rng words are not read, so the program has no rng tensor.
//
// Only nodes that work position by position can be rebuilt; a node that mixes
// positions other than causal attention (a reduction, softmax, contraction,
// slice or concat over the sequence, a causal_mask left unfused, a reshape
// that merges the sequence with another axis) is an error at its YAML line,
// as is a model without that loss.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ir/graph.h"
#include "passes/pass.h"

namespace napkin::passes {

// What the inference graph is about: the model's sequence dim and its tokens.
struct LanguageModel {
  std::string seq_dim;  // the tokens input's axis 1 ("seq")
  int64_t context = 0;  // its size T
  std::string batch_dim;  // the tokens input's axis 0 ("batch")
  int64_t batch = 0;      // its size
  int64_t vocab = 0;    // the logits' last axis
  int layers = 0;       // attention sites, one key and one value cache each
};

// The language model's facts, or nullopt with why not in `why` (no
// cross_entropy loss over [batch, seq, vocab] logits of an i32 tokens input).
std::optional<LanguageModel> find_language_model(const ir::Graph& forward, std::string* why);

// The pass ("derive_inference"): the forward graph, its attention fused and
// its precision policy applied, becomes its inference graph (run_inference_pipeline
// runs it between the forward passes and the fusion passes); an error where it cannot.
std::unique_ptr<Pass> make_derive_inference_pass();

}  // namespace napkin::passes
