#include "runtime/rng_tensor.h"

#include <cstring>

#include "runtime/error.h"
#include "runtime/rng.h"

namespace napkin::runtime {

void set_rng(Engine& engine, uint64_t seed, int64_t step, bool training) {
  for (const TensorSpec* t : engine.program().with_role(TensorRole::Rng)) {
    const std::array<int64_t, 4> words = rng_tensor_words(seed, step, training);
    if (t->dtype != DType::I64 || t->bytes != static_cast<int64_t>(sizeof(words)))
      throw Error("the program's rng tensor is " + std::string(dtype_name(t->dtype)) + " of " + std::to_string(t->bytes) +
                  " bytes, not the i64[4] this runtime writes: rebuild the trainer with this napkin");
    std::memcpy(engine.host(*t), words.data(), sizeof(words));
  }
}

}  // namespace napkin::runtime
