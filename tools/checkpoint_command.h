// `napkin checkpoint consolidate DIR/step-N.sharded -o FILE.safetensors` and
// `napkin checkpoint verify PATH`: a sharded checkpoint
// (runtime/sharded_checkpoint.h) made one file, and any checkpoint checked
// whole, without the model or its trainer.
#pragma once

#include <string>

namespace napkin::tools {

// Writes the single-file checkpoint of the sharded checkpoint `input` to
// `output` (atomically). 0, or 1 after printing the error.
int checkpoint_consolidate(const std::string& input, const std::string& output);

// Checks a checkpoint file or a sharded checkpoint's every file (sizes,
// checksums, headers) and prints what it holds. 0, or 1 after printing the
// error.
int checkpoint_verify(const std::string& path);

}  // namespace napkin::tools
