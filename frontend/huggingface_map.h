// How a model's parameters meet a Hugging Face transformers checkpoint: the
// model file's `huggingface:` section (docs/huggingface.md), as the frontend
// read and checked it, its dims evaluated at the sizes the model was loaded
// at. `napkin hf import` and `napkin hf export` read it; the compiler does
// not.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "frontend/frontend.h"

namespace napkin::frontend {

// A config.json value. An object keeps its keys in the order the model file
// wrote them (`keys[i]` names `items[i]`).
struct HfConfigValue {
  enum class Kind : uint8_t { Null, Bool, Int, Float, String, List, Object };
  Kind kind = Kind::Null;
  bool flag = false;     // Bool
  int64_t integer = 0;   // Int
  double number = 0;     // Float
  std::string text;      // String
  std::vector<std::string> keys;     // Object
  std::vector<HfConfigValue> items;  // List, Object
};

// One parameter and the transformers tensor (or tensors) that hold it.
struct HfTensor {
  std::string param;  // the model's name: "layers.0.wq"
  // "model.layers.0.self_attn.q_proj.weight"; a stacked parameter's keeps
  // the stacking placeholder: "model.layers.0.block_sparse_moe.experts.{e}.w1.weight".
  std::string hf_name;
  // A matrix [a, b] (each slice's, when stacked) that transformers stores [b, a].
  bool transpose = false;
  // A parameter stacked on its first axis that the checkpoint holds as one
  // tensor per index along it (Mixtral's experts, w_gate [E, f, d] from E
  // tensors [f, d]): their names, index 0 first. Empty for a parameter the
  // checkpoint holds whole.
  std::vector<std::string> slices;
};

// A transformers tensor that holds a copy of another parameter's tensor
// (tied weights: GPT-2's lm_head.weight is transformer.wte.weight).
struct HfTied {
  std::string hf_name;  // "lm_head.weight"
  std::string param;    // "wte"
};

struct HuggingFaceMap {
  std::string architecture;  // the transformers class: "LlamaForCausalLM"
  // The base model's attribute in that class ("transformer" in
  // GPT2LMHeadModel): a checkpoint of the base model alone names its tensors
  // without "transformer.", and import reads them with it. "" for none.
  std::string base_model_prefix;
  // config.json as the section writes it (an Object holding model_type), dims
  // evaluated; export adds architectures, tie_word_embeddings and torch_dtype.
  HfConfigValue config;
  std::vector<HfTensor> tensors;  // every parameter once, in the model's parameter order
  std::vector<HfTied> tied;
  // Glob patterns (ir/glob.h) of a checkpoint's tensors that are no
  // parameters (buffers such as rotary inv_freq, GPT-2's attn.bias masks):
  // import skips them and names them.
  std::vector<std::string> ignore;
};

// A model and its huggingface: section, for napkin hf.
struct HuggingFaceModel {
  ir::Graph graph;
  HuggingFaceMap map;
};

// load_model_file, and the model's huggingface: section; a model without one
// is an error too (at the file, saying what the section is for).
std::optional<HuggingFaceModel> load_huggingface_model(const std::string& path, ir::Diagnostics& diag,
                                                       const LoadOptions& options);

}  // namespace napkin::frontend
