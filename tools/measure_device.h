// `napkin devices --measure`: this host's row of the device table, measured
// with napkin's own runtime code the way a CPU trainer reaches each figure:
// the matmul peaks with runtime::Gemm in a runtime::ThreadPool, the memory
// and cache bandwidth with a STREAM triad split over the same pool, the loop
// FLOP/s with a cache-resident elementwise loop in the pool, the launch cost
// with an empty ThreadPool::parallel_for. Every figure's source says how it
// was measured, on which host, when and on how many threads (docs/report.md,
// "devices").
#pragma once

#include <functional>
#include <string>

#include "analysis/devices.h"

namespace napkin::tools {

struct MeasureOptions {
  int threads = 0;     // <= 0: runtime::default_thread_count(), what a trainer uses
  bool quick = false;  // smaller problems and fewer samples (tests): seconds instead of minutes
  // Told what is measured next and, when it is done, the result: progress
  // for a user waiting a minute or two. May be empty.
  std::function<void(const std::string&)> progress;
};

// Measures this host; the row is named "cpu" (it replaces the built-in cpu
// row when written to the local device file).
analysis::Device measure_host(const MeasureOptions& options);

}  // namespace napkin::tools
