// main() of every CUDA trainer: the symbols come from the data object
// `napkin build --target cuda` generates for the model (codegen/cuda). The
// program description is read before the engine is made, so --help and
// --print-program work on a machine without a GPU.
#include <cstdint>
#include <string_view>

#include "runtime/cuda/cuda_engine.h"
#include "runtime/stop_signals.h"
#include "runtime/trainer.h"

extern "C" {
extern const char napkin_program_json[];
extern const int64_t napkin_program_json_size;
extern const char napkin_cuda_cubin[];
extern const int64_t napkin_cuda_cubin_size;
extern const char napkin_cuda_ptx[];
extern const int64_t napkin_cuda_ptx_size;
}

int main(int argc, char** argv) {
  napkin::runtime::block_stop_signals();  // before any thread exists: every thread inherits the mask
  return napkin::runtime::trainer_main(
      argc, argv, napkin_program_json, static_cast<size_t>(napkin_program_json_size),
      [](const napkin::runtime::Program& program, int /*threads: the GPU's own*/) {
        return std::make_unique<napkin::runtime::cuda::CudaEngine>(
            program, std::string_view(napkin_cuda_cubin, static_cast<size_t>(napkin_cuda_cubin_size)),
            std::string_view(napkin_cuda_ptx, static_cast<size_t>(napkin_cuda_ptx_size)));
      });
}
