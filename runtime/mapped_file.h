// A whole file mapped read-only into memory. The trainer reads its data files
// (token files, .npy arrays) and checkpoints through it, so a multi-gigabyte
// token file costs address space, not RAM, and pages in as batches touch it.
//
// A mapped file can shrink under the reader (another process truncates or
// rewrites it): touching a page past the new end raises SIGBUS, which would
// kill the trainer with no message and nothing saved. So every mapping is
// guarded: a process-wide SIGBUS handler maps a page of zeros over the
// faulting page of a guarded mapping and marks the file damaged; the read
// goes on with zeros and the reader calls check_intact() after each batch,
// which throws an Error naming the file. check_intact() also compares the
// file's size now with the size at open, which catches a truncation within
// the last page (that page's tail reads as zeros without a fault).
#pragma once

#include <cstddef>
#include <string>

namespace napkin::runtime {

class MappedFile {
 public:
  // Throws Error("PATH: cannot open: <strerror>") and the like. Anything but a
  // regular file is refused before it is read, so a FIFO with no writer cannot
  // block and /dev/zero cannot be mapped. An empty file is fine: size() is 0
  // and data() is nullptr (mmap rejects length 0).
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  size_t size() const { return size_; }
  const char* data() const { return data_; }

  // Throws Error if the file shrank since it was opened (or a read already
  // touched a page past its end); the bytes read since the last check may be
  // zeros and must be thrown away.
  void check_intact() const;

 private:
  void unmap();

  std::string path_;
  const char* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;    // kept open for check_intact's fstat
  int guard_ = -1; // the slot in the SIGBUS guard's table, or -1
};

// What a path is, for messages: "a directory", "a FIFO", "a character device", ...
std::string file_kind(unsigned mode);

}  // namespace napkin::runtime
