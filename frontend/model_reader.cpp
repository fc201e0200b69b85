// Reads a whole model file: the top-level sections in dependency order
// (dims, inputs, params, blocks, forward, loss, the huggingface mapping, then
// the training settings).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "frontend/config.h"
#include "frontend/dims.h"
#include "frontend/frontend.h"
#include "frontend/huggingface.h"
#include "frontend/lowering.h"
#include "frontend/model_source.h"
#include "frontend/suggest.h"
#include "ir/internal_check.h"

namespace napkin::frontend {

namespace {

const std::vector<std::string> kTopKeys = {"model",  "description", "dims",      "inputs",    "params", "blocks",
                                           "forward", "loss",        "optimizer", "precision", "train", "huggingface"};

void read_inputs(const YAML::Node& node, YamlContext& ctx, const DimTable& dims, ir::Graph& g, Scope& scope) {
  if (!node || node.IsNull()) return;
  if (!ctx.check_mapping(node, "inputs")) return;
  for (auto it = node.begin(); it != node.end(); ++it) {
    std::string name = it->first.Scalar();
    std::string what = fmt::format("input '{}'", name);
    if (scope.values.count(name) || scope.failed.count(name)) continue;  // duplicate key: already reported
    // An input in error is reported here once; uses of it in forward: stay silent.
    scope.failed.insert(name);
    if (dims.has(name)) {
      ctx.error(it->first, fmt::format("duplicate name '{}': it is already a dim", name),
                "every dim, input and parameter needs its own name");
      continue;
    }
    auto type = read_declaration(it->first, it->second, what, dims, ctx);
    if (!type) continue;
    scope.failed.erase(name);
    scope.values[name] = g.add_input(name, *type, ctx.loc(it->first));
  }
}

std::map<std::string, BlockDef> read_blocks(const YAML::Node& node, YamlContext& ctx) {
  std::map<std::string, BlockDef> blocks;
  if (!node || node.IsNull()) return blocks;
  if (!ctx.check_mapping(node, "blocks")) return blocks;
  for (auto it = node.begin(); it != node.end(); ++it) {
    std::string name = it->first.Scalar();
    if (blocks.count(name)) continue;
    std::string what = fmt::format("block '{}'", name);
    // Filled in place, each YAML::Node member assigned once, onto an empty node:
    // assigning a Node that already refers to one (as copying a filled BlockDef
    // into the map did) rewrites it and merges the whole document's node memory
    // into its own, O(file) per block: 5000 blocks took 60 s and 11 GB.
    BlockDef& b = blocks[name];
    b.name = name;
    b.loc = ctx.loc(it->first);
    // A block in error is still registered (as failed) so that repeat() of it stays silent.
    b.failed = true;
    if (!ctx.check_keys(it->second, {"args", "params", "forward", "output"}, what)) continue;
    // Assign only keys that are present: a missing key of a const node is an
    // invalid node, and assigning one throws.
    if (const YAML::Node& params = it->second["params"]) b.params = params;
    if (const YAML::Node& forward = it->second["forward"]) b.forward = forward;
    if (const YAML::Node& args = it->second["args"]) b.args_node = args;
    b.args = {"x"};
    if (const YAML::Node& args = it->second["args"]) {
      if (!args.IsSequence() || args.size() == 0) {
        ctx.error(args, fmt::format("the args of {} must be a list of names", what), "write args: [x]");
        continue;
      }
      b.args.clear();
      for (const YAML::Node& a : args) b.args.push_back(a.IsScalar() ? a.Scalar() : "?");
    }
    if (!it->second["forward"]) {
      ctx.error(it->first, fmt::format("{} has no forward list", what), "add forward: with '- name: expression' lines");
      continue;
    }
    if (const YAML::Node& out = it->second["output"]) {
      if (!ctx.scalar_text(out, fmt::format("the output of {}", what), b.output)) continue;
    } else if (b.forward.IsSequence() && b.forward.size() > 0) {
      const YAML::Node last = b.forward[b.forward.size() - 1];
      if (last.IsMap() && last.size() == 1) {
        auto targets = parse_targets(last.begin()->first.Scalar());
        if (targets.names.size() == 1) b.output = targets.names[0].first;
      }
    }
    b.failed = false;
  }
  return blocks;
}

void read_loss(const YAML::Node& node, YamlContext& ctx, Lowerer& lowerer, Scope& scope, ir::Graph& g) {
  if (!node) {
    ctx.diag().error({ctx.file(), 1, 1}, "the model has no loss",
                     "add a top-level line such as loss: cross_entropy(logits, targets)");
    return;
  }
  Operand loss = lowerer.lower_scalar(node, scope, "loss");
  if (!loss.ok()) return;
  auto v = lowerer.need_tensor(loss, "the loss");
  if (!v) return;
  const ir::TensorType& t = g.value(*v).type;
  if (t.rank() != 0 || !ir::is_floating(t.dtype)) {
    ctx.error(node, fmt::format("the loss must be a floating-point scalar, but it is {}", ir::to_string(t)),
              "reduce it, e.g. mean(x) or cross_entropy(logits, targets)");
    return;
  }
  if (g.value(*v).name.empty()) g.value(*v).name = "loss";
  g.outputs.emplace_back("loss", *v);
}


// `huggingface`, when given, receives the huggingface: section (checked either way).
std::optional<ir::Graph> lower_model(const YAML::Node& root, YamlContext& ctx, ir::Diagnostics& diag,
                                     const LoadOptions& options, std::optional<HuggingFaceMap>* huggingface) {
  ctx.check_keys(root, kTopKeys, "the model");
  ir::Graph g;
  g.name = "model";
  if (const YAML::Node& m = root["model"])
    if (ctx.scalar_text(m, "model", g.name) && !ctx.check_name_text(m, g.name, "the model name")) g.name = "model";
  DimTable dims = read_dims(root["dims"], ctx, options.dim_overrides);
  std::map<std::string, BlockDef> blocks = read_blocks(root["blocks"], ctx);
  Scope scope;
  read_inputs(root["inputs"], ctx, dims, g, scope);
  Lowerer lowerer(g, ctx, dims, blocks);
  lowerer.declare_params(root["params"], scope);
  // forward: is optional: a model may be its loss expression alone.
  if (const YAML::Node& forward = root["forward"]) lowerer.lower_forward(forward, scope);
  read_loss(root["loss"], ctx, lowerer, scope, g);
  // After the forward: a block's parameters exist once repeat() made them.
  if (const YAML::Node& n = root["huggingface"]) {
    std::optional<HuggingFaceMap> map = read_huggingface(n, ctx, dims, g, !diag.has_errors());
    if (huggingface) *huggingface = std::move(map);
  }
  if (const YAML::Node& n = root["optimizer"]) {
    std::vector<std::string> params;
    for (const ir::Param& p : g.params) params.push_back(g.value(p.value).name);
    read_optimizer(n, ctx, g.config.optimizer, diag.has_errors() ? nullptr : &params);
  } else {
    diag.error({ctx.file(), 1, 1}, "the model has no optimizer", "add a line such as optimizer: adamw(lr=3e-4)");
  }
  if (const YAML::Node& n = root["precision"]) read_precision(n, ctx, g.config.precision);
  if (const YAML::Node& n = root["train"]) read_train(n, ctx, g, g.config.train);
  // Each model, and each --dims variant of one, gets a checkpoint directory
  // and a metrics file of its own by default (checkpoints/gpt,
  // checkpoints/gpt@d=64,layers=2; metrics/gpt.jsonl, metrics/gpt@d=64,layers=2.jsonl),
  // so two of them never meet in one directory or file by accident. The
  // checkpoint directory is one directory inside checkpoints/: the name's
  // slashes become '_', and a name "." or ".." (which would name checkpoints/
  // or its parent) is spelled in '_' too.
  std::string& ckpt_dir = g.config.train.checkpoint_dir;
  std::string& metrics = g.config.train.metrics_path;
  if (ckpt_dir.empty()) {
    std::string entry = g.name;
    std::replace(entry.begin(), entry.end(), '/', '_');
    if (entry == "." || entry == "..") entry.assign(entry.size(), '_');
    ckpt_dir = "checkpoints/" + entry;
  }
  if (!options.dim_overrides.empty()) {
    std::string variant;
    for (const auto& [name, value] : options.dim_overrides) variant += (variant.empty() ? "@" : ",") + name + "=" + std::to_string(value);
    g.config.train.dims = variant.substr(1);
    while (ckpt_dir.size() > 1 && ckpt_dir.back() == '/') ckpt_dir.pop_back();
    ckpt_dir += variant;
    if (!metrics.empty()) {
      const std::filesystem::path file(metrics);
      metrics = (file.parent_path() / (file.stem().string() + variant + file.extension().string())).string();
    }
  }
  if (diag.has_errors()) return std::nullopt;
  return g;
}

}  // namespace

std::optional<ir::Graph> load_model_text(const std::string& text, const std::string& path, ir::Diagnostics& diag) {
  return load_model_text(text, path, diag, LoadOptions{});
}

namespace {

std::optional<ir::Graph> load_text(const std::string& text, const std::string& path, ir::Diagnostics& diag,
                                   const LoadOptions& options, std::optional<HuggingFaceMap>* huggingface) {
  diag.add_source(path, text);
  YamlContext ctx(path, text, diag);
  std::optional<YAML::Node> document = parse_model_document(text, ctx);
  if (!document) return std::nullopt;
  const YAML::Node& root = *document;
  if (!root.IsMap()) {
    // Point at the list or value that stands where the mapping should be (an
    // empty file has no mark: then line 1).
    ir::SourceLoc at = ctx.loc(root);
    if (!at.known()) at = {ctx.file(), 1, 1};
    diag.error(at, "a model file must be a YAML mapping with keys like dims:, params:, forward:",
               "see models/gpt.yaml for a complete example");
    return std::nullopt;
  }
  // The readers check every node before they read it, so a yaml-cpp exception
  // from here on is a napkin bug: report it as one, with this file:line, not as a crash.
  try {
    return lower_model(root, ctx, diag, options, huggingface);
  } catch (const YAML::Exception& e) {
    throw ir::InternalError(__FILE__, __LINE__, fmt::format("yaml-cpp threw while reading the model: {}", e.what()));
  }
}

}  // namespace

std::optional<ir::Graph> load_model_text(const std::string& text, const std::string& path, ir::Diagnostics& diag,
                                         const LoadOptions& options) {
  return load_text(text, path, diag, options, nullptr);
}

std::optional<ir::Graph> load_model_file(const std::string& path, ir::Diagnostics& diag) {
  return load_model_file(path, diag, LoadOptions{});
}

std::optional<ir::Graph> load_model_file(const std::string& path, ir::Diagnostics& diag, const LoadOptions& options) {
  std::optional<std::string> text = read_model_file(path, diag);
  if (!text) return std::nullopt;
  return load_model_text(*text, path, diag, options);
}

std::optional<HuggingFaceModel> load_huggingface_model(const std::string& path, ir::Diagnostics& diag,
                                                       const LoadOptions& options) {
  std::optional<std::string> text = read_model_file(path, diag);
  if (!text) return std::nullopt;
  std::optional<HuggingFaceMap> map;
  std::optional<ir::Graph> g = load_text(*text, path, diag, options, &map);
  if (!g) return std::nullopt;
  if (!map) {
    diag.error({std::make_shared<const std::string>(path), 1, 1},
               "the model has no huggingface: section, which says how a transformers checkpoint names and lays out "
               "its parameters",
               "add one (docs/huggingface.md; models/gpt2-124m.yaml and models/llama.yaml have one)");
    return std::nullopt;
  }
  return HuggingFaceModel{std::move(*g), std::move(*map)};
}

}  // namespace napkin::frontend
