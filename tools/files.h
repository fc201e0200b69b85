// The driver's file helpers: reading a file whole, hashing bytes, and the
// checks every command runs before it reads or writes a user's path.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace napkin::tools {

// The file's bytes ("" when it cannot be read).
std::string read_file_bytes(const std::string& path);

// FNV-1a 64 over some byte strings, as 16 hex digits: cache keys and sums,
// not security.
std::string fnv1a_hex(std::initializer_list<std::string_view> parts);

// A file napkin writes must not be one it reads, nor a directory: `napkin
// build M.yaml -o M.yaml` would replace the model with the trainer, and `-o
// DIR` cannot be written atomically. Every command checks each path it
// writes with this, before it writes anything. The same file is the same
// device and inode (a link to an input, or `./M.yaml`, is the input), and
// the local device file (analysis::local_device_file()) is an input of every
// command. Returns the error line, or "".
std::string output_problem(const std::string& flag, const std::string& output, const std::vector<std::string>& inputs);

// Text napkin reads as data must be a regular file: /dev/zero would never end
// and a FIFO without a writer would never start. Returns the error line, or "".
std::string input_problem(const std::string& path);

// Writes `text` to `path` through a temporary file in the same directory
// (synced) and a rename, so that a reader sees the old file or the new one,
// never a part. Returns the error line, or "".
std::string write_atomically(const std::string& path, const std::string& text);

}  // namespace napkin::tools
