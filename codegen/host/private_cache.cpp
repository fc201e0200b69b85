#include "codegen/host/private_cache.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <system_error>

namespace napkin::codegen::host {

std::filesystem::path user_cache_root() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::filesystem::path(x) / "napkin";
  if (const char* h = std::getenv("HOME"); h && *h) return std::filesystem::path(h) / ".cache" / "napkin";
  // A shared temporary directory: one cache per user, which
  // private_directory_problem refuses when someone else made it first.
  return std::filesystem::temp_directory_path() / fmt::format("napkin-cache-{}", ::geteuid());
}

std::string private_directory_problem(const std::filesystem::path& dir) {
  std::error_code ec;
  if (dir.has_parent_path()) std::filesystem::create_directories(dir.parent_path(), ec);  // a failure fails mkdir
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return fmt::format("{}: cannot create it ({})", dir.string(), std::strerror(errno));
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return fmt::format("{}: cannot read it ({})", dir.string(), std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return fmt::format("{}: is not a directory", dir.string());
  if (st.st_uid != ::geteuid())
    return fmt::format("{}: is owned by another user (uid {}), so a program in it could be theirs; napkin runs only "
                       "programs it built", dir.string(), st.st_uid);
  if ((st.st_mode & 022) != 0)
    return fmt::format("{}: can be written by other users (mode {:o}), so a program in it could be theirs; napkin runs "
                       "only programs it built", dir.string(), st.st_mode & 0777);
  return "";
}

std::string untrusted_entry(const std::filesystem::path& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "is not a regular file";
  if (st.st_uid != ::geteuid()) return fmt::format("is owned by another user (uid {})", st.st_uid);
  if ((st.st_mode & 022) != 0) return fmt::format("can be written by other users (mode {:o})", st.st_mode & 0777);
  return "";
}

}  // namespace napkin::codegen::host
