// The buffer model of a training step's memory: one MemoryBuffer per owning
// value that costs bytes, its category and live range. analyze_memory
// (analysis/memory.h) makes them, in-place reuse (analysis/in_place_reuse.h)
// links them, the memory plan (analysis/memory_plan.h) places them; the terms
// are memory.h's.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "ir/graph.h"

namespace napkin::analysis {

enum class MemoryCategory : uint8_t {
  Parameters,
  Gradients,
  OptimizerState,
  Inputs,
  SavedActivations,
  Temporaries,
};
inline constexpr int kNumMemoryCategories = 6;
// All categories, in the order the report lists them.
inline constexpr MemoryCategory kMemoryCategories[kNumMemoryCategories] = {
    MemoryCategory::Parameters, MemoryCategory::Gradients,        MemoryCategory::OptimizerState,
    MemoryCategory::Inputs,     MemoryCategory::SavedActivations, MemoryCategory::Temporaries};
// "parameters", "gradients", "optimizer state", "inputs", "saved activations", "temporaries".
std::string_view memory_category_name(MemoryCategory c);

// Bytes per category, indexed by static_cast<int>(MemoryCategory).
using CategoryBytes = std::array<int64_t, kNumMemoryCategories>;

// One buffer that costs bytes.
struct MemoryBuffer {
  ir::ValueId value = ir::kNoValue;  // the owning value
  std::string name;                  // its name, or "%<id>" when it has none
  int64_t bytes = 0;
  ir::DType dtype = ir::DType::F32;
  MemoryCategory category = MemoryCategory::Temporaries;
  ir::NodeId producer = ir::kNoNode;  // kNoNode for params, state and inputs
  // YAML line of the producer (of the declaration for params, state and
  // inputs); 0 when unknown.
  int line = 0;
  // Live range, schedule positions, both inclusive. Resident buffers: 0 .. n-1.
  int first = 0, last = 0;
  bool resident = false;
  // The update target whose new value this is (counted apart because it could
  // not be written in place); kNoValue otherwise.
  ir::ValueId update_of = ir::kNoValue;
  // The buffer whose memory this one takes over in place; kNoValue otherwise.
  ir::ValueId reuses = ir::kNoValue;
};

}  // namespace napkin::analysis
