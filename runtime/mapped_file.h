// A whole file mapped read-only into memory. The trainer reads its data files
// (token files, .npy arrays) and checkpoints through it, so a multi-gigabyte
// token file costs address space, not RAM, and pages in as batches touch it.
#pragma once

#include <cstddef>
#include <string>

namespace napkin::runtime {

class MappedFile {
 public:
  // Throws Error("PATH: cannot open: <strerror>") and the like. An empty file
  // is fine: size() is 0 and data() is nullptr (mmap rejects length 0).
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  size_t size() const { return size_; }
  const char* data() const { return data_; }

 private:
  void unmap();

  std::string path_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace napkin::runtime
