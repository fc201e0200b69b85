#include "tools/checkpoint_command.h"

#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "runtime/checkpoint.h"
#include "runtime/error.h"
#include "runtime/sharded_checkpoint.h"
#include "tools/files.h"

namespace napkin::tools {

int checkpoint_consolidate(const std::string& input, const std::string& output) {
  try {
    if (!runtime::is_sharded_checkpoint(input))
      throw runtime::Error(fmt::format("{}: not a sharded checkpoint (a directory step-N.sharded holding index.json); "
                                       "a step-N.safetensors file is one file already",
                                       input));
    const runtime::ShardedIndex index = runtime::read_sharded_index(input);
    std::vector<std::string> inputs;
    for (const runtime::ShardFile& f : index.files) inputs.push_back(input + "/" + f.name);
    if (std::string problem = output_problem("-o", output, inputs); !problem.empty()) throw runtime::Error(problem);
    // Its step's file beside the directory would save the step twice, which resume refuses as ambiguous.
    auto directory_of = [](std::string path) {
      while (path.size() > 1 && path.back() == '/') path.pop_back();
      const std::filesystem::path parent = std::filesystem::path(path).parent_path();
      return parent.empty() ? std::filesystem::path(".") : parent;
    };
    std::error_code ec;
    if (runtime::checkpoint_step(std::filesystem::path(output).filename().string()) == index.step &&
        std::filesystem::equivalent(directory_of(output), directory_of(input), ec))
      throw runtime::Error(fmt::format("-o {}: beside {} it would save step {} twice, which --resume refuses as "
                                       "ambiguous; write it elsewhere",
                                       output, input, index.step));
    const runtime::CheckpointHeader h = runtime::consolidate_sharded_checkpoint(input, output);
    std::cout << fmt::format("wrote {}: step {} of run {} ({}), one file of the {} shards, every shard's size and "
                             "checksum verified\n",
                             output, h.step, h.run,
                             h.metadata.count("model") ? runtime::printable(h.metadata.at("model")) : "model",
                             inputs.size());
    return 0;
  } catch (const runtime::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}

int checkpoint_verify(const std::string& path) {
  try {
    // The checkpoint's own model: verify checks it is whole, not which trainer it loads into.
    const runtime::CheckpointHeader h = runtime::verify_checkpoint(path, runtime::read_checkpoint_header(path).model_hash);
    const bool sharded = runtime::is_sharded_checkpoint(path);
    if (!sharded && h.metadata.count("shard_ranks")) {  // one rank's file: intact, but a part
      std::cout << fmt::format("{}: intact, but one rank's file (rank {} of {}) of a sharded checkpoint of step {}: "
                               "verify its directory for the whole\n",
                               path, h.metadata.count("shard_rank") ? runtime::printable(h.metadata.at("shard_rank")) : "?",
                               runtime::printable(h.metadata.at("shard_ranks")), h.step);
      return 0;
    }
    std::cout << fmt::format("{}: a whole checkpoint: step {} of run {} ({}, model hash {}){}\n", path, h.step,
                             h.run.empty() ? "unknown" : h.run,
                             h.metadata.count("model") ? runtime::printable(h.metadata.at("model")) : "model",
                             h.model_hash,
                             sharded ? fmt::format(", {} shards, every file's size and checksum verified",
                                                   runtime::read_sharded_index(path).ranks)
                                     : ", its checksum verified");
    return 0;
  } catch (const runtime::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace napkin::tools
