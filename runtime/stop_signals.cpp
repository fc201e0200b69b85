#include "runtime/stop_signals.h"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <mutex>
#include <thread>

namespace napkin::runtime {

namespace {

std::atomic<void (*)(int)> g_on_signal{nullptr};

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// What `sig` does to a process that does not catch it: the default action
// ends it, by the signal, as it would have ended unblocked; an ignored one
// does nothing (a disposition inherited from the parent, e.g. SIGINT of a
// background job in a non-interactive shell).
void take_default_action(int sig) {
  struct sigaction current {};
  ::sigaction(sig, nullptr, &current);
  if (current.sa_handler == SIG_IGN) return;
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  ::raise(sig);  // delivered to this thread, now unblocked: the process ends
}

void take_signals() {
  ::pthread_setname_np(::pthread_self(), kStopSignalThreadName);
  const sigset_t set = stop_signal_set();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);  // sigwait takes blocked signals only (main() blocked them already)
  for (;;) {
    int sig = 0;
    if (::sigwait(&set, &sig) != 0) continue;
    if (void (*on_signal)(int) = g_on_signal.load()) on_signal(sig);
    else take_default_action(sig);
  }
}

}  // namespace

void block_stop_signals() {
  const sigset_t set = stop_signal_set();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void unblock_stop_signals() {
  const sigset_t set = stop_signal_set();
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

void start_stop_signal_thread() {
  static std::once_flag started;
  std::call_once(started, [] { std::thread(take_signals).detach(); });
}

void catch_stop_signals(void (*on_signal)(int)) { g_on_signal.store(on_signal); }

}  // namespace napkin::runtime
