// main() of every CPU trainer: the symbols come from the object file napkin
// generated for the model (codegen/cpu/cpu_backend.h lists them). A language
// model's object also has its sampler program (napkin_sampler_*); the weak
// references are null where it has none.
#include <cstdint>

#include "runtime/cpu_engine.h"
#include "runtime/stop_signals.h"
#include "runtime/trainer.h"

extern "C" {
extern const napkin::runtime::KernelCode napkin_kernel_fns[];
extern const char napkin_program_json[];
extern const int64_t napkin_program_json_size;
extern const napkin::runtime::KernelCode napkin_sampler_kernel_fns[] __attribute__((weak));
extern const char napkin_sampler_program_json[] __attribute__((weak));
extern const int64_t napkin_sampler_program_json_size __attribute__((weak));
}

namespace {

napkin::runtime::EngineFactory cpu_engine(const napkin::runtime::KernelCode* fns) {
  return [fns](const napkin::runtime::Program& program, int threads) {
    return std::make_unique<napkin::runtime::CpuEngine>(program, fns, threads);
  };
}

}  // namespace

int main(int argc, char** argv) {
  napkin::runtime::block_stop_signals();  // before any thread exists: every thread inherits the mask
  napkin::runtime::SamplerProgram sampler;
  if (&napkin_sampler_program_json_size != nullptr)
    sampler = {napkin_sampler_program_json, static_cast<size_t>(napkin_sampler_program_json_size),
               cpu_engine(napkin_sampler_kernel_fns)};
  return napkin::runtime::trainer_main(argc, argv, napkin_program_json, static_cast<size_t>(napkin_program_json_size),
                                       cpu_engine(napkin_kernel_fns), sampler);
}
