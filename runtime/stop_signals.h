// SIGINT and SIGTERM in a trainer: taken by one thread with sigwait, never by
// a signal handler.
//
// Why not a handler: the kernel runs a handler on whichever thread it picks,
// on that thread's stack, and a thread inside oneDNN's JIT GEMM may have its
// stack pointer somewhere a signal frame must not go (a known oneDNN 2.x
// bug points it into the heap): Ctrl-C crashed the trainer (status 134 or
// 139, no final checkpoint) in 14 of 240 tries. So the signals are blocked in
// every thread and arrive as ordinary function calls on a thread of their
// own:
//
// 1. main() calls block_stop_signals() first, before any thread exists; each
//    thread inherits its creator's mask (the thread pool's, oneDNN's and
//    OpenMP's, MPI's progress threads, the collective watchdog).
// 2. start_stop_signal_thread() starts the one thread that sigwaits.
// 3. Until catch_stop_signals(on_signal) is called, a signal does what it
//    would have done unblocked: the process ends by it (or nothing, where
//    the disposition was inherited as ignored). Afterwards each signal calls
//    on_signal(sig) on that thread, as plain code: it may allocate, print,
//    or end the process.
#pragma once

namespace napkin::runtime {

// Blocks SIGINT and SIGTERM in the calling thread (and so in every thread
// it creates afterwards).
void block_stop_signals();
// Unblocks them again: for a process that wants their default action after
// all (napkin sample's sampler, which shares the trainer's main()). Call it
// before any thread exists.
void unblock_stop_signals();

// Starts the thread that takes SIGINT and SIGTERM (once per process; later
// calls do nothing). It lives as long as the process, named
// kStopSignalThreadName (/proc/PID/task/TID/comm). While it waits in sigwait
// the kernel shows the two signals unblocked in its mask; they are blocked
// in every other thread.
constexpr const char* kStopSignalThreadName = "napkin-signals";
void start_stop_signal_thread();

// From now on each SIGINT or SIGTERM calls on_signal(sig) on the signal
// thread (one call per signal, in order).
void catch_stop_signals(void (*on_signal)(int sig));

}  // namespace napkin::runtime
