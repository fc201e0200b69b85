#include "analysis/buffers.h"

namespace napkin::analysis {

std::string_view memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::Parameters: return "parameters";
    case MemoryCategory::Gradients: return "gradients";
    case MemoryCategory::OptimizerState: return "optimizer state";
    case MemoryCategory::Inputs: return "inputs";
    case MemoryCategory::SavedActivations: return "saved activations";
    case MemoryCategory::Temporaries: return "temporaries";
  }
  return "?";
}

}  // namespace napkin::analysis
