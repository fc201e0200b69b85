#include "frontend/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "frontend/suggest.h"
#include "ir/glob.h"

namespace napkin::frontend {

namespace {

// A value in an optimizer call: a number (folded), a word/string, or a list.
struct ConfigValue {
  enum class Kind { Number, Text, List } kind = Kind::Number;
  double number = 0;
  std::string text;
  std::vector<ConfigValue> items;
  int offset = 0;
};

std::optional<ConfigValue> fold(const Expr& e, const ir::SourceLoc& base, ir::Diagnostics& diag) {
  ConfigValue v;
  v.offset = e.offset;
  switch (e.kind) {
    case ExprKind::Number: v.number = e.number; return v;
    case ExprKind::Name:
    case ExprKind::String: v.kind = ConfigValue::Kind::Text; v.text = e.text; return v;
    case ExprKind::Unary: {
      auto x = fold(*e.args[0], base, diag);
      if (!x || x->kind != ConfigValue::Kind::Number) break;
      x->number = e.text == "-" ? -x->number : x->number;
      x->offset = e.offset;
      return x;
    }
    case ExprKind::Binary: {
      auto a = fold(*e.args[0], base, diag), b = fold(*e.args[1], base, diag);
      if (!a || !b || a->kind != ConfigValue::Kind::Number || b->kind != ConfigValue::Kind::Number) break;
      const std::string& op = e.text;
      if (op == "+") v.number = a->number + b->number;
      else if (op == "-") v.number = a->number - b->number;
      else if (op == "*") v.number = a->number * b->number;
      else if (op == "/") v.number = a->number / b->number;
      else if (op == "**") v.number = std::pow(a->number, b->number);
      else break;
      return v;
    }
    case ExprKind::List:
      v.kind = ConfigValue::Kind::List;
      for (const ExprPtr& item : e.args) {
        auto x = fold(*item, base, diag);
        if (!x) return std::nullopt;
        v.items.push_back(*x);
      }
      return v;
    default: break;
  }
  diag.error(base.shifted(e.offset), fmt::format("'{}' is not a constant value", to_string(e)),
             "use numbers, names, strings or lists of them");
  return std::nullopt;
}

const std::vector<std::string> kCommonKeys = {"lr", "weight_decay", "grad_clip", "schedule", "warmup", "min_lr", "no_decay"};

// The options of each optimizer besides kCommonKeys.
std::vector<std::string> optimizer_keys(ir::OptimizerKind k) {
  switch (k) {
    case ir::OptimizerKind::SGD:
    case ir::OptimizerKind::Momentum: return {"momentum", "nesterov"};
    case ir::OptimizerKind::AdaGrad: return {"eps"};
    case ir::OptimizerKind::RMSProp: return {"alpha", "eps", "momentum"};
    case ir::OptimizerKind::Adam:
    case ir::OptimizerKind::AdamW: return {"betas", "eps"};
  }
  return {};
}

// The names of `kinds`, sorted, for messages.
template <class Kind, size_t N>
std::vector<std::string> sorted_names(const Kind (&kinds)[N], std::string_view (*name_of)(Kind)) {
  std::vector<std::string> names;
  for (Kind k : kinds) names.emplace_back(name_of(k));
  std::sort(names.begin(), names.end());
  return names;
}

// What a no_decay pattern that matches no parameter was likely meant to be:
// the most common slip is "ln*" for "blocks.0.ln1_g", as a pattern must match
// the whole name.
std::string no_decay_suggestion(const std::string& pattern, const std::vector<std::string>& params) {
  const std::string anywhere = "*" + pattern;
  for (const std::string& name : params)
    if (ir::glob_match(anywhere, name))
      return fmt::format("; did you mean '{}'? (a pattern matches the whole name, block prefixes included)", anywhere);
  return did_you_mean(pattern, params);
}

// "w, w_b, ..." for a hint: the first few names and how many there are.
std::string some_names(const std::vector<std::string>& names) {
  constexpr size_t kShown = 10;
  if (names.size() <= kShown) return fmt::format("{}", fmt::join(names, ", "));
  return fmt::format("{}, ... ({} in all; napkin ir MODEL.yaml lists them)",
                     fmt::join(names.begin(), names.begin() + kShown, ", "), names.size());
}

}  // namespace

void read_optimizer(const YAML::Node& node, YamlContext& ctx, ir::OptimizerConfig& out,
                    const std::vector<std::string>* param_names) {
  ExprPtr e = ctx.parse_scalar_expr(node, "optimizer");
  if (!e) return;
  ir::SourceLoc base = ctx.text_loc(node);
  auto err = [&](int offset, std::string msg, std::string hint = "") {
    ctx.diag().error(base.shifted(offset), std::move(msg), std::move(hint));
  };
  static const std::vector<std::string> names = sorted_names(ir::kAllOptimizers, ir::optimizer_name);
  if (e->kind != ExprKind::Call && e->kind != ExprKind::Name) {
    err(e->offset, "optimizer must be a call such as adamw(lr=3e-4)",
        fmt::format("known optimizers: {}", fmt::join(names, ", ")));
    return;
  }
  std::optional<ir::OptimizerKind> kind = ir::parse_optimizer(e->text);
  if (!kind) {
    err(e->offset, fmt::format("unknown optimizer '{}'{}", e->text, did_you_mean(e->text, names)),
        fmt::format("known optimizers: {}", fmt::join(names, ", ")));
    return;
  }
  out = {};
  out.kind = *kind;
  if (out.kind == ir::OptimizerKind::Momentum) out.momentum = 0.9;
  if (out.kind == ir::OptimizerKind::AdaGrad) out.eps = 1e-10;  // torch.optim.Adagrad's default
  std::vector<std::string> allowed = kCommonKeys;
  for (std::string& key : optimizer_keys(out.kind)) allowed.push_back(std::move(key));
  std::map<std::string, ConfigValue> values;
  if (e->args.size() > 1) {
    err(e->args[1]->offset, fmt::format("{} takes only lr as a positional argument", e->text),
        "pass the rest by name, e.g. weight_decay=0.1");
    return;
  }
  if (e->args.size() == 1) {
    if (auto v = fold(*e->args[0], base, ctx.diag())) values["lr"] = *v;
    else return;
  }
  for (const KeywordArg& kw : e->kwargs) {
    if (std::find(allowed.begin(), allowed.end(), kw.name) == allowed.end()) {
      err(kw.offset, fmt::format("{} has no option '{}'{}", e->text, kw.name, did_you_mean(kw.name, allowed)),
          fmt::format("options of {}: {}", e->text, fmt::join(allowed, ", ")));
      continue;
    }
    if (values.count(kw.name)) {
      err(kw.offset, fmt::format("option '{}' is given twice", kw.name), "remove one of them");
      continue;
    }
    if (auto v = fold(*kw.value, base, ctx.diag())) values[kw.name] = *v;
  }
  auto number = [&](const std::string& key, double& slot, double lo, double hi, bool lo_open, const char* range,
                    const char* example) {
    auto it = values.find(key);
    if (it == values.end()) return;
    const ConfigValue& v = it->second;
    bool ok = v.kind == ConfigValue::Kind::Number && std::isfinite(v.number) &&
              (lo_open ? v.number > lo : v.number >= lo) && v.number < hi;
    if (!ok) {
      err(v.offset, fmt::format("{}: {} must be a number {}", e->text, key, range),
          fmt::format("for example {}={}", key, example));
      return;
    }
    slot = v.number;
  };
  if (!values.count("lr")) {
    err(e->offset, fmt::format("{} needs a learning rate", e->text), fmt::format("write {}(lr=1e-3, ...)", e->text));
  }
  number("lr", out.lr, 0, INFINITY, true, "> 0", "3e-4");
  number("weight_decay", out.weight_decay, 0, INFINITY, false, ">= 0", "0.1");
  number("grad_clip", out.grad_clip, 0, INFINITY, true, "> 0 (the max global gradient norm)", "1.0");
  number("min_lr", out.min_lr, 0, INFINITY, false, ">= 0", "3e-5");
  number("momentum", out.momentum, 0, 1, false, "in [0, 1)", "0.9");
  number("alpha", out.alpha, 0, 1, false, "in [0, 1)", "0.99");
  number("eps", out.eps, 0, INFINITY, true, "> 0", "1e-8");
  if (auto it = values.find("warmup"); it != values.end()) {
    const ConfigValue& v = it->second;
    // Above 2^53 a double is not a count of steps, and converting 1e300 to int64 is undefined.
    if (v.kind != ConfigValue::Kind::Number || v.number < 0 || v.number != std::floor(v.number) ||
        v.number > 9007199254740992.0)
      err(v.offset, "warmup must be a whole number of steps >= 0 (and below 2^53)", "for example warmup=100");
    else
      out.warmup_steps = static_cast<int64_t>(v.number);
  }
  if (auto it = values.find("betas"); it != values.end()) {
    const ConfigValue& v = it->second;
    bool ok = v.kind == ConfigValue::Kind::List && v.items.size() == 2;
    for (size_t i = 0; ok && i < 2; ++i)
      ok = v.items[i].kind == ConfigValue::Kind::Number && v.items[i].number >= 0 && v.items[i].number < 1;
    if (!ok)
      err(v.offset, "betas must be a list of two numbers in [0, 1)",
          "beta1 and beta2 are the decay rates of the moment averages, e.g. betas=[0.9, 0.95]");
    else {
      out.beta1 = v.items[0].number;
      out.beta2 = v.items[1].number;
    }
  }
  if (auto it = values.find("nesterov"); it != values.end()) {
    const ConfigValue& v = it->second;
    if (v.kind != ConfigValue::Kind::Text || (v.text != "true" && v.text != "false"))
      err(v.offset, "nesterov must be true or false", "write nesterov=true or nesterov=false");
    else
      out.nesterov = v.text == "true";
    if (out.nesterov && out.momentum == 0)
      err(v.offset, "nesterov needs momentum > 0", "add momentum=0.9");
  }
  if (auto it = values.find("schedule"); it != values.end()) {
    const ConfigValue& v = it->second;
    if (v.kind != ConfigValue::Kind::Text || (v.text != "constant" && v.text != "cosine"))
      err(v.offset, "schedule must be constant or cosine",
          "cosine is a linear warmup, then a cosine decay to min_lr; write schedule=cosine");
    else
      out.schedule = v.text;
  }
  if (auto it = values.find("no_decay"); it != values.end()) {
    const ConfigValue& v = it->second;
    bool ok = v.kind == ConfigValue::Kind::List;
    for (const ConfigValue& item : v.items) ok = ok && item.kind == ConfigValue::Kind::Text;
    if (!ok)
      err(v.offset, "no_decay must be a list of parameter-name patterns",
          "quote each pattern: no_decay=[\"*_b\", \"*_g\"]");
    else
      for (const ConfigValue& item : v.items) {
        out.no_decay.push_back(item.text);
        if (!param_names) continue;
        const std::vector<std::string>& params = *param_names;
        if (std::none_of(params.begin(), params.end(),
                         [&](const std::string& name) { return ir::glob_match(item.text, name); }))
          err(item.offset,
              fmt::format("no_decay pattern '{}' matches no parameter{}", item.text,
                          no_decay_suggestion(item.text, params)),
              params.empty() ? "the model has no parameters: remove no_decay"
                             : fmt::format("a pattern matches parameter names (`*` any run of characters, `?` one); "
                                           "the parameters: {}",
                                           some_names(params)));
      }
  }
}

// `fp32: ["blocks.0", "logits"]`: glob patterns of ops kept in f32; whether
// each selects something is checked by the mixed-precision pass, which knows the ops.
static void read_fp32_overrides(const YAML::Node& list, YamlContext& ctx, ir::PrecisionConfig& out) {
  const char* hint = "write a list of quoted patterns of value names or blocks, e.g. fp32: [\"blocks.0\", \"logits\"]";
  if (!list.IsSequence()) {
    ctx.error(list, "precision fp32 must be a list of patterns", hint);
    return;
  }
  for (const YAML::Node& item : list) {
    std::string pattern;
    if (!item.IsScalar() || (pattern = item.Scalar()).empty()) {
      ctx.error(item, "a precision fp32 pattern must be a non-empty string", hint);
      continue;
    }
    out.fp32.push_back({pattern, ctx.text_loc(item)});
  }
}

void read_precision(const YAML::Node& node, YamlContext& ctx, ir::PrecisionConfig& out) {
  static const std::vector<std::string> names = sorted_names(ir::kAllPrecisions, ir::precision_name);
  // Never assign to a YAML::Node after construction: yaml-cpp's operator=
  // rewrites the node it refers to, not the handle.
  const YAML::Node policy = node.IsMap() ? node["policy"] : node;
  if (node.IsMap()) {
    if (!ctx.check_keys(node, {"policy", "loss_scale", "fp32"}, "precision")) return;
    if (!policy) {
      ctx.error(node, "precision needs a policy", fmt::format("policies: {}", fmt::join(names, ", ")));
      return;
    }
    if (const YAML::Node& ls = node["loss_scale"]) {
      if (ctx.check_keys(ls, {"init", "growth_interval", "growth_factor", "backoff"}, "loss_scale")) {
        // `below` bounds growth_interval, a step count that becomes an int64: converting
        // 1e300 (or .inf) to one is undefined. No value may be infinite.
        auto positive = [&](const char* key, double& slot, double below = INFINITY) {
          if (const YAML::Node& v = ls[key]) {
            try {
              double x = v.as<double>();
              if (!(x > 0 && std::isfinite(x) && x < below)) throw YAML::Exception(v.Mark(), "");
              slot = x;
            } catch (const YAML::Exception&) {
              ctx.error(v, fmt::format("loss_scale {} must be a positive number{}", key,
                                       std::isfinite(below) ? " below 2^53" : ""),
                        "the defaults follow torch.cuda.amp.GradScaler; remove the key to use them");
            }
          }
        };
        double interval = static_cast<double>(out.loss_scale.growth_interval);
        positive("init", out.loss_scale.init_scale);
        positive("growth_interval", interval, 9007199254740992.0);
        positive("growth_factor", out.loss_scale.growth_factor);
        positive("backoff", out.loss_scale.backoff_factor);
        if (interval != std::floor(interval)) {
          ctx.error(ls["growth_interval"], fmt::format("loss_scale growth_interval must be a whole number of steps, got {}", interval),
                    "for example growth_interval: 2000");
          interval = static_cast<double>(out.loss_scale.growth_interval);
        }
        out.loss_scale.growth_interval = static_cast<int64_t>(interval);
      }
    }
  }
  if (node.IsMap())
    if (const YAML::Node& list = node["fp32"]) read_fp32_overrides(list, ctx, out);
  std::string text;
  if (!ctx.scalar_text(policy, "precision", text)) return;
  std::optional<ir::PrecisionPolicy> parsed = ir::parse_precision(text);
  if (!parsed) {
    // "bf16" names a dtype; the policy that computes in it is "bf16-mixed".
    std::string suggestion = ir::parse_precision(text + "-mixed") ? fmt::format("; did you mean '{}-mixed'?", text)
                                                                  : did_you_mean(text, names);
    ctx.error(policy, fmt::format("unknown precision policy '{}'{}", text, suggestion),
              fmt::format("policies: {}", fmt::join(names, ", ")));
    return;
  }
  out.policy = *parsed;
  if (out.policy == ir::PrecisionPolicy::FP32 && !out.fp32.empty())
    ctx.error(node["fp32"], "precision fp32 overrides have no effect under the fp32 policy",
              "every op already computes in f32: remove the fp32 list, or choose a mixed policy such as bf16-mixed");
}

namespace {

bool read_int(const YAML::Node& node, YamlContext& ctx, const std::string& what, int64_t min, int64_t& out) {
  if (!node) return true;
  try {
    int64_t v = node.as<int64_t>();
    if (v < min) throw YAML::Exception(node.Mark(), "");
    out = v;
    return true;
  } catch (const YAML::Exception&) {
    ctx.error(node, fmt::format("{} must be a whole number >= {}", what, min),
              fmt::format("write an integer such as {}", std::max<int64_t>(min, 1) * 10));
    return false;
  }
}

void read_data(const YAML::Node& node, YamlContext& ctx, const ir::Graph& g, ir::DataSource& out) {
  if (!ctx.check_keys(node, {"format", "path", "dtype", "files", "order", "split"}, "train.data")) return;
  std::string format;
  if (!node["format"]) {
    ctx.error(node, "train.data needs a format", "format: tokens (a raw token file) or format: npy (one .npy per input)");
    return;
  }
  if (!ctx.scalar_text(node["format"], "train.data.format", format)) return;
  if (format != "tokens" && format != "npy") {
    ctx.error(node["format"], fmt::format("unknown data format '{}'", format),
              "format: tokens (a raw token file) or format: npy (one .npy per input)");
    return;
  }
  out.format = format;
  if (const YAML::Node& order = node["order"]) {
    ctx.scalar_text(order, "train.data.order", out.order);
    if (out.order != "random" && out.order != "sequential")
      ctx.error(order, "train.data.order must be random or sequential", "write order: random");
  }
  if (format == "tokens") {
    if (!node["path"])
      ctx.error(node, "train.data with format: tokens needs a path to the token file",
                "add path: data/train.u16 (napkin data encode writes one)");
    else ctx.path_text(node["path"], "train.data.path", out.path);
    if (const YAML::Node& d = node["dtype"]) {
      ctx.scalar_text(d, "train.data.dtype", out.token_dtype);
      if (out.token_dtype != "u16" && out.token_dtype != "u32" && out.token_dtype != "i32")
        ctx.error(d, "token files hold u16, u32 or i32 tokens",
                  "napkin data encode writes u16, or u32 with --dtype u32 (a vocabulary over 65,536)");
    }
    if (const YAML::Node& s = node["split"]) {
      try {
        out.split = s.as<double>();
        if (!(out.split > 0 && out.split <= 1)) throw YAML::Exception(s.Mark(), "");
      } catch (const YAML::Exception&) {
        ctx.error(s, "train.data.split must be a fraction in (0, 1]",
                  "the fraction of tokens used for training, e.g. split: 0.9");
      }
    }
    // Token windows become two inputs of the same [batch, seq] shape: ids and next ids.
    bool ok = g.inputs.size() == 2;
    for (ir::ValueId v : g.inputs)
      ok = ok && ir::is_integer(g.value(v).type.dtype) && g.value(v).type.rank() == 2 &&
           g.value(v).type.same_shape(g.value(g.inputs[0]).type);
    if (!ok)
      ctx.error(node["format"], "format: tokens needs exactly two integer inputs of shape [batch, seq] (tokens, targets)",
                "use format: npy for other inputs");
    if (node["files"])
      ctx.error(node["files"], "files: belongs to format: npy", "remove files:, or write format: npy");
    return;
  }
  for (const char* key : {"path", "dtype", "split"})
    if (node[key])
      ctx.error(node[key], fmt::format("{}: belongs to format: tokens", key),
                fmt::format("remove {}:, or write format: tokens", key));
  const YAML::Node& files = node["files"];
  if (!files) {
    ctx.error(node, "train.data with format: npy needs files: mapping each input to a .npy path",
              "add files: {input_name: path/to/input.npy, ...}");
    return;
  }
  std::vector<std::string> input_names;
  for (ir::ValueId v : g.inputs) input_names.push_back(g.value(v).name);
  if (!ctx.check_keys(files, input_names, "train.data.files")) return;
  for (auto it = files.begin(); it != files.end(); ++it) {
    std::string path;
    if (ctx.path_text(it->second, "a data file path", path)) out.files[it->first.Scalar()] = path;
  }
  for (const std::string& n : input_names)
    if (!out.files.count(n))
      ctx.error(files, fmt::format("train.data.files has no file for input '{}'", n),
                fmt::format("add {}: path/to/{}.npy under files:", n, n));
}

}  // namespace

void read_train(const YAML::Node& node, YamlContext& ctx, const ir::Graph& g, ir::TrainConfig& out) {
  if (!ctx.check_keys(node, {"steps", "seed", "data", "eval", "checkpoint", "log", "tokens_per_step", "accumulate"},
                      "train"))
    return;
  read_int(node["steps"], ctx, "train.steps", 1, out.steps);
  read_int(node["accumulate"], ctx, "train.accumulate", 1, out.accumulate);
  if (const YAML::Node& s = node["seed"]) {
    int64_t seed = 0;
    if (read_int(s, ctx, "train.seed", 0, seed)) out.seed = static_cast<uint64_t>(seed);
  }
  read_int(node["tokens_per_step"], ctx, "train.tokens_per_step", 1, out.tokens_per_step);
  if (const YAML::Node& d = node["data"]) {
    out.has_data = true;
    read_data(d, ctx, g, out.data);
  }
  if (const YAML::Node& e = node["eval"]) {
    if (ctx.check_keys(e, {"every", "batches"}, "train.eval")) {
      read_int(e["every"], ctx, "train.eval.every", 1, out.eval_every);
      read_int(e["batches"], ctx, "train.eval.batches", 1, out.eval_batches);
    }
  }
  if (const YAML::Node& c = node["checkpoint"]) {
    if (ctx.check_keys(c, {"every", "dir", "keep"}, "train.checkpoint")) {
      read_int(c["every"], ctx, "train.checkpoint.every", 1, out.checkpoint_every);
      read_int(c["keep"], ctx, "train.checkpoint.keep", 1, out.checkpoint_keep);
      if (c["dir"]) ctx.path_text(c["dir"], "train.checkpoint.dir", out.checkpoint_dir);
    }
  }
  if (const YAML::Node& l = node["log"]) {
    if (ctx.check_keys(l, {"every", "metrics"}, "train.log")) {
      read_int(l["every"], ctx, "train.log.every", 1, out.log_every);
      if (l["metrics"]) ctx.path_text(l["metrics"], "train.log.metrics", out.metrics_path);
    }
  }
}

}  // namespace napkin::frontend
