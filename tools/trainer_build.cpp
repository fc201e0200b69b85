#include "tools/trainer_build.h"

#include "ir/printer.h"
#include "tools/files.h"

namespace napkin::tools {

std::string model_hash(const ir::Graph& g) { return fnv1a_hex({ir::print_graph(g, {false})}); }

}  // namespace napkin::tools
