// `napkin devices`: the device table and where each figure comes from;
// `napkin devices --measure`: this host's row, measured (tools/measure_device.h)
// and written to the local device file (analysis::local_device_file()).
#pragma once

#include <string>

#include "analysis/devices.h"

namespace napkin::tools {

struct DevicesArgs {
  bool sources = false;  // every figure's value and source, not one line per device
  bool measure = false;
  bool quick = false;    // --measure --quick: seconds, rough figures (tests)
  int threads = 0;       // --measure on this many threads (0: a trainer's default)
  std::string out;       // --measure writes here (empty: analysis::local_device_file())
};

// The command; returns the exit status (1 with `error: ...` printed).
int cmd_devices(const DevicesArgs& args);

// Writes `measured` into the device file at `path`, keeping the file's other
// rows (a row of the same name is replaced): atomically (a temporary file
// renamed over it), creating the parent directories. Refuses a directory, a
// non-regular file and a file that is not a napkin device file; a device file
// napkin cannot read any more is replaced, and `note` says what was wrong
// with it. Returns what went wrong, or "".
std::string write_device_row(const std::string& path, const analysis::Device& measured, std::string* note);

}  // namespace napkin::tools
