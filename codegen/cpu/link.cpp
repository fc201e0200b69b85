#include "codegen/cpu/link.h"

#include "codegen/cpu/link_config.h"
#include "codegen/host/link.h"

namespace napkin::codegen::cpu {

const char* kernel_link_flags() { return "-lmvec -lm"; }

void link_trainer(const std::string& object_bytes, const std::string& executable) {
  host::link_executable(object_bytes,
                        std::string(kTrainerMainObject) + " " + kRuntimeLibrary + " " + kRuntimeLinkFlags + " " +
                            kernel_link_flags() + " -lpthread",
                        executable);
}

}  // namespace napkin::codegen::cpu
