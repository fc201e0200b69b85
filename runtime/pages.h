// The arena's memory by whole pages: what giving back a byte range
// (madvise) frees, for the executor that does it and the memory prediction
// that counts it (runtime/rank_memory.h), which a CUDA trainer links
// without the CPU executor.
#pragma once

#include <cstdint>

namespace napkin::runtime {

int64_t page_size();

// The whole pages inside [offset, offset + bytes): [begin, end), empty when
// end <= begin.
struct PageRange {
  int64_t begin = 0, end = 0;
  int64_t bytes() const { return end > begin ? end - begin : 0; }
};
PageRange whole_pages(int64_t offset, int64_t bytes);

}  // namespace napkin::runtime
