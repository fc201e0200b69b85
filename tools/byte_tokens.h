// `napkin data encode`: byte-level tokens, every byte of the inputs in
// order, one u16 token each (a vocab of 256), the format train.data
// {format: tokens, dtype: u16} reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace napkin::tools {

// Writes the tokens of `inputs` to `output` atomically (a temp file renamed
// over it). Returns the number of tokens, or -1 with `error` set (an input
// that is not a readable regular file, an output that is an input or a
// directory or cannot be written); nothing is left behind on failure.
int64_t write_byte_tokens(const std::vector<std::string>& inputs, const std::string& output, std::string& error);

}  // namespace napkin::tools
