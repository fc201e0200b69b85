// Reads a whole model file: the top-level sections in dependency order
// (dims, inputs, params, blocks, forward, loss, then the training settings).
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "frontend/config.h"
#include "frontend/dims.h"
#include "frontend/frontend.h"
#include "frontend/lowering.h"
#include "frontend/suggest.h"
#include "ir/internal_check.h"

namespace napkin::frontend {

namespace {

const std::vector<std::string> kTopKeys = {"model",  "description", "dims",      "inputs",    "params", "blocks",
                                           "forward", "loss",        "optimizer", "precision", "train"};

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


// yaml-cpp's messages name the parser state ("illegal flow end"); the hint says
// what usually causes each in a hand-written model file.
std::string yaml_syntax_hint(const std::string& msg) {
  static const std::vector<std::pair<std::string, std::string>> hints = {
      {"illegal tab", "YAML indents with spaces only: replace the tab with spaces"},
      {"illegal flow end", "this ']' or '}' does not match the bracket it closes: '[' pairs with ']', '{' with '}'"},
      {"end of sequence flow not found", "a '[' is never closed: add the matching ']'"},
      {"end of map flow not found", "a '{' is never closed: add the matching '}'"},
      {"illegal map value",
       "a ':' where no key can start: indent this line like the keys above it, or quote a value that contains ': '"},
      {"end of map not found", "indent this line like the other keys of its mapping"},
      {"end of sequence not found", "indent this '- ' entry like the other entries of its list"},
      {"illegal block entry", "a '- ' entry where a value is expected: check the indentation of this line"},
      {"illegal EOF in scalar", "a quoted string is never closed: add the closing quote"},
      {"unknown escape character", "inside double quotes write a backslash as \\\\, or use single quotes"},
  };
  for (const auto& [key, hint] : hints)
    if (msg.find(key) != std::string::npos) return hint;
  return "check indentation, colons and brackets around this point";
}

// yaml-cpp reports an unclosed '[' or '{' where it gives up, often the next
// key or past the end of the file. Scanning the text up to that point finds the
// bracket that is still open, which is where the fix goes. Returns 0-based
// (line, column), or (-1, -1) if none is open.
std::pair<int, int> open_flow_bracket(const std::string& text, int stop_line, int stop_col) {
  std::vector<std::pair<int, int>> open;
  char quote = 0;
  int line = 0, col = 0;
  for (size_t i = 0; i < text.size() && (line < stop_line || (line == stop_line && col < stop_col)); ++i) {
    char c = text[i];
    char before = i > 0 ? text[i - 1] : '\n';
    bool token_start = before == ' ' || before == '\t' || before == '\n' || before == '[' || before == '{' ||
                       before == ',' || before == ':';
    if (c == '\n') {
      quote = 0;  // quoted scalars spanning lines are rare in model files; don't let one stray quote run on
      ++line;
      col = 0;
      continue;
    }
    ++col;
    if (quote) {
      if (c == '\\' && quote == '"') ++i, ++col;
      else if (c == quote) quote = 0;
    } else if ((c == '"' || c == '\'') && token_start) {
      quote = c;
    } else if (c == '#' && (before == ' ' || before == '\t' || before == '\n')) {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;  // a comment runs to the end of the line
    } else if (c == '[' || c == '{') {
      open.emplace_back(line, col - 1);
    } else if ((c == ']' || c == '}') && !open.empty()) {
      open.pop_back();
    }
  }
  return open.empty() ? std::pair{-1, -1} : open.back();
}

std::optional<ir::Graph> lower_model(const YAML::Node& root, YamlContext& ctx, ir::Diagnostics& diag,
                                     const LoadOptions& options) {
  ctx.check_keys(root, kTopKeys, "the model");
  ir::Graph g;
  g.name = "model";
  if (const YAML::Node& m = root["model"]) ctx.scalar_text(m, "model", g.name);
  DimTable dims = read_dims(root["dims"], ctx, options.dim_overrides);
  std::map<std::string, BlockDef> blocks = read_blocks(root["blocks"], ctx);
  Scope scope;
  read_inputs(root["inputs"], ctx, dims, g, scope);
  Lowerer lowerer(g, ctx, dims, blocks);
  lowerer.declare_params(root["params"], scope);
  // forward: is optional: a model may be its loss expression alone.
  if (const YAML::Node& forward = root["forward"]) lowerer.lower_forward(forward, scope);
  read_loss(root["loss"], ctx, lowerer, scope, g);
  if (const YAML::Node& n = root["optimizer"]) read_optimizer(n, ctx, g.config.optimizer);
  else diag.error({ctx.file(), 1, 1}, "the model has no optimizer", "add a line such as optimizer: adamw(lr=3e-4)");
  if (const YAML::Node& n = root["precision"]) read_precision(n, ctx, g.config.precision);
  if (const YAML::Node& n = root["train"]) read_train(n, ctx, g, g.config.train);
  // Each model, and each --dims variant of one, gets a checkpoint directory of
  // its own by default (checkpoints/gpt, checkpoints/gpt@d=64,layers=2), so
  // two of them never meet in one directory by accident.
  std::string& ckpt_dir = g.config.train.checkpoint_dir;
  if (ckpt_dir.empty()) ckpt_dir = "checkpoints/" + g.name;
  if (!options.dim_overrides.empty()) {
    while (ckpt_dir.size() > 1 && ckpt_dir.back() == '/') ckpt_dir.pop_back();
    std::string variant;
    for (const auto& [name, value] : options.dim_overrides) variant += (variant.empty() ? "@" : ",") + name + "=" + std::to_string(value);
    ckpt_dir += variant;
  }
  if (diag.has_errors()) return std::nullopt;
  return g;
}

}  // namespace

// YAML is UTF-8 text; a stray byte would otherwise surface later as garbage in
// names and reports. Returns the 1-based line and column of the first bad byte.
static std::optional<std::pair<int, int>> first_invalid_utf8(const std::string& text) {
  int line = 1, col = 1;
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    size_t length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = length > 0 && i + length <= text.size();
    for (size_t k = 1; ok && k < length; ++k) ok = (static_cast<unsigned char>(text[i + k]) >> 6) == 0x2;
    if (!ok) return std::make_pair(line, col);
    if (c == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
    i += length;
  }
  return std::nullopt;
}

std::optional<ir::Graph> load_model_text(const std::string& text, const std::string& path, ir::Diagnostics& diag) {
  return load_model_text(text, path, diag, LoadOptions{});
}

std::optional<ir::Graph> load_model_text(const std::string& text, const std::string& path, ir::Diagnostics& diag,
                                         const LoadOptions& options) {
  diag.add_source(path, text);
  YamlContext ctx(path, text, diag);
  if (auto bad = first_invalid_utf8(text)) {
    diag.error({ctx.file(), bad->first, bad->second}, "the model file is not valid UTF-8 here",
               "save the file as UTF-8 text");
    return std::nullopt;
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    ir::SourceLoc at{ctx.file(), e.mark.line + 1, e.mark.column + 1};
    if (e.msg.find("flow not found") != std::string::npos) {
      auto [line, col] = open_flow_bracket(text, e.mark.line, e.mark.column);
      if (line >= 0) at = {ctx.file(), line + 1, col + 1};
    }
    diag.error(at, fmt::format("YAML syntax: {}", e.msg), yaml_syntax_hint(e.msg));
    return std::nullopt;
  }
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
    return lower_model(root, ctx, diag, options);
  } catch (const YAML::Exception& e) {
    throw ir::InternalError(__FILE__, __LINE__, fmt::format("yaml-cpp threw while reading the model: {}", e.what()));
  }
}

std::optional<ir::Graph> load_model_file(const std::string& path, ir::Diagnostics& diag) {
  return load_model_file(path, diag, LoadOptions{});
}

std::optional<ir::Graph> load_model_file(const std::string& path, ir::Diagnostics& diag, const LoadOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    diag.error({std::make_shared<const std::string>(path), 0, 0}, "cannot open the model file",
               "check the path; models/ holds the built-in examples");
    return std::nullopt;
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return load_model_text(buffer.str(), path, diag, options);
}

}  // namespace napkin::frontend
