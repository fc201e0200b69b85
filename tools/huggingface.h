// napkin hf import and napkin hf export (docs/huggingface.md): weights from a
// transformers checkpoint into a file that a trainer's --init and napkin
// sample load, and a napkin checkpoint's parameters out to a directory that
// transformers' from_pretrained loads as is, both by the model's
// huggingface: section (frontend/huggingface_map.h).
#pragma once

#include <string>

#include "frontend/huggingface_map.h"
#include "ir/dtype.h"

namespace napkin::tools {

// Reads the checkpoint at `hf_path` (tools/huggingface_files.h) and writes
// `output`: a safetensors file of every parameter under its napkin name, in
// its dtype (f32, bf16 and f16 tensors widen exactly; transposed as the map
// says), nothing else. A tensor matched by an ignore pattern is skipped; a
// tied one, when the checkpoint has it, must equal the tensor it repeats.
// Every mismatch (missing, unexpected, wrong shape or dtype) is listed in one
// runtime::Error, and then nothing is written. Returns what it did, for the
// user.
std::string import_huggingface(const frontend::HuggingFaceModel& model, const std::string& hf_path,
                               const std::string& output);

// Reads the model's parameters from `checkpoint` (a napkin checkpoint, whose
// optimizer state is skipped, the newest of a directory of them, or a weights
// file such as import's) and writes
// DIR/model.safetensors (the checkpoint names and layouts, in `dtype`: f32,
// bf16 or f16, rounded to nearest even; metadata {"format": "pt"}; tied
// tensors left out, as save_pretrained does) and DIR/config.json. A value
// that overflows `dtype` is an error. Returns what it did.
std::string export_huggingface(const frontend::HuggingFaceModel& model, const std::string& checkpoint,
                               const std::string& dir, ir::DType dtype);

}  // namespace napkin::tools
