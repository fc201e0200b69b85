// main() of every CPU trainer: the symbols come from the object file napkin
// generated for the model (codegen/cpu/cpu_backend.h lists them).
#include <cstdint>

#include "runtime/cpu_engine.h"
#include "runtime/trainer.h"

extern "C" {
extern const napkin::runtime::KernelFn napkin_kernel_fns[];
extern const char napkin_program_json[];
extern const int64_t napkin_program_json_size;
}

int main(int argc, char** argv) {
  return napkin::runtime::trainer_main(argc, argv, napkin_program_json, static_cast<size_t>(napkin_program_json_size),
                                       [](const napkin::runtime::Program& program, int threads) {
                                         return std::make_unique<napkin::runtime::CpuEngine>(program, napkin_kernel_fns,
                                                                                            threads);
                                       });
}
