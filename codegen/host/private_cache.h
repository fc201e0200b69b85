// The on-disk caches whose contents napkin runs or loads: the CPU trainer
// cache (tools/trainer_cache.h runs the trainers it finds) and the CUDA
// kernel cache (codegen/cuda/kernel_cache.h loads the cubins it finds). A
// checksum beside an entry proves nothing when someone else can write both,
// so both caches trust only what is the user's own, by the rule here:
//  - root: $XDG_CACHE_HOME/napkin, else ~/.cache/napkin, else
//    $TMPDIR/napkin-cache-UID: one per user even in a shared temporary
//    directory, never a /tmp path another user could have made first.
//  - private directory: one the user owns and no one else can write (group
//    and other write bits clear); napkin makes its own mode 0700. A cache
//    directory that is not private, or cannot be made, is a problem the user
//    fixes (the caches report it as an error naming the directory).
//  - trusted entry: a regular file (not a symbolic link) the user owns that no
//    one else can write; any other entry is rebuilt, never run or loaded.
#pragma once

#include <filesystem>
#include <string>

namespace napkin::codegen::host {

// The root of the user's napkin caches (see above).
std::filesystem::path user_cache_root();

// Why `dir` is not a private directory, as "DIR: what is wrong" for a
// message, or "" when it is. Makes it (mode 0700, missing parents as usual)
// when it does not exist.
std::string private_directory_problem(const std::filesystem::path& dir);

// Why the cache entry `path` (present) must not be run or loaded, as "is ..."
// for a message, or "" when it is a trusted entry.
std::string untrusted_entry(const std::filesystem::path& path);

}  // namespace napkin::codegen::host
