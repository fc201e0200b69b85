#include "runtime/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <utility>

#include "runtime/error.h"

namespace napkin::runtime {

namespace {

// The SIGBUS guard's table: one slot per live mapping. The handler only reads
// lock-free atomics and calls mmap, so it is safe to run at any point of any
// thread; slots are claimed and released under a mutex by ordinary code.
struct GuardSlot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<size_t> size{0};
  std::atomic<bool> damaged{false};
};
constexpr int kGuardSlots = 256;
GuardSlot g_guard[kGuardSlots];
std::mutex g_guard_mutex;
struct sigaction g_previous_sigbus;
bool g_handler_installed = false;
uintptr_t g_page_size = 4096;  // set before the handler is installed: sysconf is not async-signal-safe

extern "C" void on_sigbus(int sig, siginfo_t* info, void* context) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (GuardSlot& slot : g_guard) {
    const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    const size_t size = slot.size.load(std::memory_order_acquire);
    if (begin == 0 || addr < begin || addr >= begin + size) continue;
    const uintptr_t page = g_page_size;
    void* at = reinterpret_cast<void*>(addr & ~(page - 1));
    // Zeros in place of the vanished page; the faulting load then completes.
    if (::mmap(at, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
      slot.damaged.store(true, std::memory_order_release);
      return;
    }
    break;
  }
  // Not ours (or the remap failed): what would have happened without us.
  if (g_previous_sigbus.sa_flags & SA_SIGINFO) {
    if (g_previous_sigbus.sa_sigaction) return g_previous_sigbus.sa_sigaction(sig, info, context);
  } else if (g_previous_sigbus.sa_handler != SIG_DFL && g_previous_sigbus.sa_handler != SIG_IGN) {
    return g_previous_sigbus.sa_handler(sig);
  }
  ::signal(SIGBUS, SIG_DFL);
  // A fault re-runs its load on return and dies as it would have without us;
  // a SIGBUS sent by kill(2) has no load to re-run, so it is raised again.
  if (info->si_code <= 0) ::raise(SIGBUS);
}

int claim_guard(const char* data, size_t size) {
  std::lock_guard<std::mutex> lock(g_guard_mutex);
  if (!g_handler_installed) {
    g_page_size = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (::sigaction(SIGBUS, &sa, &g_previous_sigbus) != 0) return -1;
    g_handler_installed = true;
  }
  for (int i = 0; i < kGuardSlots; ++i) {
    if (g_guard[i].begin.load() != 0) continue;
    g_guard[i].damaged.store(false);
    g_guard[i].size.store(size);
    g_guard[i].begin.store(reinterpret_cast<uintptr_t>(data), std::memory_order_release);
    return i;
  }
  return -1;  // table full: this mapping is unguarded (a SIGBUS kills as before)
}

void release_guard(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(g_guard_mutex);
  g_guard[slot].begin.store(0, std::memory_order_release);
  g_guard[slot].size.store(0);
}

}  // namespace

std::string file_kind(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISREG(mode)) return "a regular file";
  return "not a regular file";
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever;
  // it is refused below like any other non-regular file.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file (it is " + file_kind(st.st_mode) + ")");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw Error(path + ": cannot map into memory: " + std::strerror(err));
    }
    data_ = static_cast<const char*>(p);
    guard_ = claim_guard(data_, size_);
  }
  fd_ = fd;
}

MappedFile::~MappedFile() { unmap(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)),
      guard_(std::exchange(other.guard_, -1)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
    guard_ = std::exchange(other.guard_, -1);
  }
  return *this;
}

void MappedFile::check_intact() const {
  bool damaged = guard_ >= 0 && g_guard[guard_].damaged.load(std::memory_order_acquire);
  struct stat st;
  size_t now = size_;
  if (fd_ >= 0 && ::fstat(fd_, &st) == 0) now = static_cast<size_t>(st.st_size);
  if (damaged || now < size_)
    throw Error(path_ + ": the file shrank while the trainer was reading it (" + std::to_string(size_) +
                " bytes at start, " + std::to_string(now) +
                " now): it was truncated or rewritten in place by another program");
}

void MappedFile::unmap() {
  release_guard(guard_);
  guard_ = -1;
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace napkin::runtime
