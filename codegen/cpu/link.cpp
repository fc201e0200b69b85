#include "codegen/cpu/link.h"

#include "codegen/cpu/link_config.h"
#include "codegen/host/link.h"

namespace napkin::codegen::cpu {

const char* kernel_link_flags() { return "-lmvec -lm"; }

void link_trainer(const std::string& object_bytes, const std::string& object_path, const std::string& executable) {
  host::write_file(object_path, object_bytes);
  host::link_executable(host::shell_quoted(object_path) + " " + kTrainerMainObject + " " + kRuntimeLibrary + " " +
                            kRuntimeLinkFlags + " " + kernel_link_flags() + " -lpthread",
                        executable);
}

}  // namespace napkin::codegen::cpu
