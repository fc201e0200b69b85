#include "runtime/pages.h"

#include <unistd.h>

namespace napkin::runtime {

int64_t page_size() { return ::sysconf(_SC_PAGESIZE); }

PageRange whole_pages(int64_t offset, int64_t bytes) {
  const int64_t page = page_size();
  return {(offset + page - 1) / page * page, (offset + bytes) / page * page};
}

}  // namespace napkin::runtime
