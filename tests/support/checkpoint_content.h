// A checkpoint's content without what two runs that computed the same thing
// write differently: the run id (random per fresh run, runtime/checkpoint.h)
// and the checksum, which covers it. "Resumed equals uninterrupted, bit for
// bit" compares this: every tensor's bytes and every other metadata value.
#pragma once

#include <string>

#include "runtime/safetensors.h"

namespace napkin::testing {

inline std::string checkpoint_content(const std::string& path) {
  runtime::SafetensorsFile f(path);
  std::string s;
  for (const auto& [key, value] : f.metadata())
    if (key != "run" && key != "checksum") s += key + "=" + value + "\n";
  for (const auto& t : f.tensors()) s += t.name + " " + runtime::tensor_type_text(t.dtype, t.shape) + "\n";
  s.append(f.data_section(), f.data_size());
  return s;
}

}  // namespace napkin::testing
