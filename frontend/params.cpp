// Parameters and block instances: `params:` entries (shape, dtype, init) and
// repeat(block, n, x), which stamps out a block n times with per-layer names.
#include <fmt/format.h>

#include <cmath>
#include <set>
#include <utility>

#include "frontend/lowering.h"
#include "frontend/suggest.h"

namespace napkin::frontend {

using ir::InitSpec;

namespace {
const std::vector<std::string> kInitKinds = {"zeros", "ones", "constant", "normal", "trunc_normal", "xavier"};
}

std::optional<InitSpec> Lowerer::read_init(const YAML::Node& node, const std::string& param,
                                           const std::vector<ir::Dim>& shape) {
  std::string what = fmt::format("the init of '{}'", param);
  ExprPtr expr = ctx_.parse_scalar_expr(node, what);
  if (!expr) return std::nullopt;
  Frame frame(*this, scope_, ctx_.text_loc(node));

  if (expr->kind != ExprKind::Name && expr->kind != ExprKind::Call) {
    error(expr->offset, fmt::format("{} must be one of {}", what, fmt::join(kInitKinds, ", ")),
          "for example init: normal(0.02)");
    return std::nullopt;
  }
  const std::string& kind = expr->text;
  if (std::find(kInitKinds.begin(), kInitKinds.end(), kind) == kInitKinds.end()) {
    error(expr->offset, fmt::format("unknown init '{}'{}", kind, did_you_mean(kind, kInitKinds)),
          fmt::format("known inits: {}", fmt::join(kInitKinds, ", ")));
    return std::nullopt;
  }
  // Each argument given, a finite number, with where it was written, so that a
  // bad value gets the caret, not the call. (Not the operand's offset: +x
  // evaluates to x's.)
  struct Given {
    double value;
    int offset;
  };
  std::map<std::string, Given> given;
  auto at = [&](const std::string& name) {
    auto it = given.find(name);
    return it == given.end() ? expr->offset : it->second.offset;
  };
  // Binds the arguments to the init's parameter names (all of them numbers);
  // false if that failed (reported).
  auto bind = [&](const std::vector<std::string>& names, size_t required) {
    BindOptions options;
    options.first_error_ends = true;
    options.check = [&](const std::string& name, const Expr& written, const Operand& value) {
      auto v = need_number(value, fmt::format("{} argument '{}'", kind, name));
      if (!v) return false;
      if (!std::isfinite(*v)) {
        error(written.offset, fmt::format("{} argument '{}' must be a finite number", kind, name),
              "init arguments are ordinary numbers, e.g. normal(0.02)");
        return false;
      }
      given[name] = {*v, written.offset};
      return true;
    };
    options.too_many = [&](size_t positionals) {
      return fmt::format("{} takes {} argument{}, got {}", kind, names.size(), names.size() == 1 ? "" : "s",
                         positionals);
    };
    options.missing = [&](const std::string& name) { return fmt::format("{} needs argument '{}'", kind, name); };
    options.hint = [&](ArgumentError e) -> std::string {
      if (e == ArgumentError::Twice) return "give it once, by position or by name";
      if (e == ArgumentError::Missing) return fmt::format("for example {}(0.02)", kind);
      return names.empty() ? "write it without arguments" : fmt::format("arguments: {}", fmt::join(names, ", "));
    };
    return bind_arguments(*this, *expr, names, required, options).has_value();
  };
  auto positive_std = [&](double s) {
    if (s > 0 && std::isfinite(s)) return true;
    error(at("std"), fmt::format("{}: std must be positive, got {}", kind, s),
          fmt::format("std is the standard deviation, e.g. {}(0.02)", kind));
    return false;
  };

  InitSpec init;
  if (kind == "zeros" || kind == "ones") {
    if (!bind({}, 0)) return std::nullopt;
    init.kind = kind == "zeros" ? InitSpec::Kind::Zeros : InitSpec::Kind::Ones;
  } else if (kind == "constant") {
    if (!bind({"value"}, 1)) return std::nullopt;
    init.kind = InitSpec::Kind::Constant;
    init.value = given.at("value").value;
  } else if (kind == "normal") {
    if (!bind({"std"}, 1) || !positive_std(given.at("std").value)) return std::nullopt;
    init.kind = InitSpec::Kind::Normal;
    init.std = given.at("std").value;
  } else if (kind == "trunc_normal") {
    if (!bind({"std", "a", "b"}, 1) || !positive_std(given.at("std").value)) return std::nullopt;
    init.kind = InitSpec::Kind::TruncNormal;
    init.std = given.at("std").value;
    // torch.nn.init.trunc_normal_ defaults: a = -2, b = 2 (absolute values).
    init.lo = given.count("a") ? given.at("a").value : -2.0;
    init.hi = given.count("b") ? given.at("b").value : 2.0;
    if (!(init.lo < init.hi)) {
      error(given.count("a") ? at("a") : at("b"),
            fmt::format("trunc_normal: the cut a={} must be below b={}", init.lo, init.hi),
            "a and b are the absolute cut points, e.g. trunc_normal(0.02, a=-0.04, b=0.04)");
      return std::nullopt;
    }
  } else {  // xavier, as in the lecture: std = 1/sqrt(fan_in), truncated at +-3 std
    if (!bind({}, 0)) return std::nullopt;
    if (shape.size() < 2) {
      error(expr->offset,
            fmt::format("xavier needs a fan-in, but '{}' has {} axis{}", param, shape.size(),
                        shape.size() == 1 ? "" : "es"),
            "xavier is for weight matrices [fan_in, ..., fan_out]; use zeros, ones or normal(std) for vectors");
      return std::nullopt;
    }
    init.kind = InitSpec::Kind::Xavier;
    init.fan_in = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) init.fan_in *= shape[i].size;
    init.std = 1.0 / std::sqrt(static_cast<double>(init.fan_in));
    init.lo = -3 * init.std;
    init.hi = 3 * init.std;
  }
  return init;
}

bool Lowerer::declare_params(const YAML::Node& params, Scope& scope) {
  if (!params || params.IsNull()) return true;
  if (!ctx_.check_mapping(params, "params")) return false;
  int errors_before = ctx_.diag().error_count();
  std::set<std::string> seen;
  for (auto it = params.begin(); it != params.end(); ++it) {
    std::string name = it->first.Scalar();
    if (!seen.insert(name).second) continue;  // duplicate key: already reported
    const YAML::Node spec = it->second;  // a copy: it->second lives in a temporary proxy
    std::string what = fmt::format("parameter '{}'", name);
    if (dims_.has(name) || scope.values.count(name) || scope.failed.count(name)) {
      ctx_.error(it->first, fmt::format("duplicate name '{}': it is already {}", name,
                                        dims_.has(name) ? "a dim" : scope.in_block() ? "an argument of the block"
                                                                                     : "an input or parameter"),
                 "every dim, input and parameter needs its own name");
      continue;
    }
    // A block sees the model's parameters by name: one of its own with the same
    // name would make every use of the name ambiguous.
    if (scope.in_block() && (model_params_.count(name) || model_params_failed_.count(name))) {
      ctx_.error(it->first, fmt::format("the block's parameter '{}' has the same name as the model's parameter '{}'",
                                        name, name),
                 fmt::format("a block sees the model's parameters, so '{0}' would be ambiguous: rename this one to "
                             "give each copy its own, or delete it to share the model's '{0}' across copies",
                             name));
      scope.failed.insert(name);
      continue;
    }
    // A parameter in error is reported here once; uses of it in forward: stay silent.
    scope.failed.insert(name);
    auto type = read_declaration(it->first, spec, what, dims_, ctx_,
                                 {.floating_only = true,
                                  .needs = "init",
                                  .needs_hint = "add init: zeros, ones, constant(v), normal(std), "
                                                "trunc_normal(std, a, b) or xavier"});
    if (!type) continue;
    auto init = read_init(spec["init"], name, type->dims);
    if (!init) continue;
    double elements = param_elements_ + ir::element_count(type->dims);
    if (elements > ir::kMaxElements) {
      ctx_.error(it->first,
                 fmt::format("{} brings the model's parameters to {:.3g} elements, more than napkin's limit of 2^50",
                             what, elements),
                 "check the dims and repeat counts: this is far beyond any device's memory");
      continue;
    }
    param_elements_ = elements;
    scope.failed.erase(name);
    scope.values[name] = g_.add_param(scope.qualified(name), *type, *init, ctx_.loc(it->first));
    param_names_.insert(scope.qualified(name));
    if (!scope.in_block()) model_params_[name] = scope.values[name];
  }
  if (!scope.in_block())
    for (const std::string& name : seen)
      if (scope.failed.count(name)) model_params_failed_.insert(name);
  return ctx_.diag().error_count() == errors_before;
}

bool Lowerer::check_block_use(const BlockDef& block, const char* verb, int offset) {
  if (failed_blocks_.count(block.name)) return false;  // its body's error is reported, at its first use
  if (std::find(active_blocks_.begin(), active_blocks_.end(), block.name) != active_blocks_.end()) {
    error(offset, fmt::format("block '{}' {} itself: {} -> {}", block.name, verb, fmt::join(active_blocks_, " -> "),
                              block.name),
          "a block cannot use itself, directly or through another block: its copies would never end");
    return false;
  }
  // Each nested block lowers a body on top of the ones around it, and each
  // body's expressions may nest 200 deep: 32 levels overflowed the stack under
  // ASan (5000 without it). Real models nest two or three levels.
  constexpr size_t kMaxNesting = 8;
  if (active_blocks_.size() >= kMaxNesting) {
    error(offset, fmt::format("blocks nest too deeply: {} -> {} is {} levels, at most {}",
                              fmt::join(active_blocks_, " -> "), block.name, active_blocks_.size() + 1, kMaxNesting),
          "use a block inside another at most a few levels deep; flatten the innermost blocks");
    return false;
  }
  // The args: names, checked where they are written (the default [x] is fine).
  // Like forward names they may not be dims, and like a block's own params
  // they may not be the model's parameter names, which the block sees.
  // Checked at the block's first use only, so a mistake is reported once.
  if (auto known = block_args_ok_.find(block.name); known != block_args_ok_.end()) return known->second;
  bool& ok = block_args_ok_[block.name];
  ok = true;
  std::set<std::string> seen;
  for (size_t i = 0; i < block.args.size(); ++i) {
    const std::string& name = block.args[i];
    YAML::Node written = block.args_node ? block.args_node[i] : YAML::Node();
    ir::SourceLoc at = written ? ctx_.loc(written) : block.loc;
    std::string problem, hint;
    TargetList parsed = parse_targets(!written || written.IsScalar() ? name : "");
    if (parsed.names.size() != 1 || !parsed.errors.empty() || parsed.names[0].first != name) {
      problem = fmt::format("an argument of block '{}' must be a name", block.name);
      hint = "write args: [x, mask], one name per argument";
    } else if (!seen.insert(name).second) {
      problem = fmt::format("block '{}' lists the argument '{}' twice", block.name, name);
      hint = "give each argument its own name";
    } else if (dims_.has(name)) {
      problem = fmt::format("the argument '{}' of block '{}' is already a dim", name, block.name);
      hint = "choose another name: inside the block it would hide the dim";
    } else if (model_params_.count(name) || model_params_failed_.count(name)) {
      problem = fmt::format("the argument '{}' of block '{}' has the same name as the model's parameter '{}'", name,
                            block.name, name);
      hint = fmt::format("a block sees the model's parameters, so '{}' would be ambiguous: rename the argument",
                         name);
    } else {
      continue;
    }
    ctx_.diag().error(at, problem, hint);
    ok = false;
  }
  return ok;
}

Operand Lowerer::lower_block_copy(const BlockDef& block, const std::vector<ir::ValueId>& args,
                                  const std::string& prefix, int offset) {
  Scope inner;
  inner.prefix = prefix;
  inner.top = scope_->in_block() ? scope_->top : scope_;
  inner.call_line = scope_->in_block() ? scope_->call_line : base_.line;
  // The first name at or after "prefix." starts with it iff any does.
  if (auto taken = param_names_.lower_bound(inner.prefix + ".");
      taken != param_names_.end() && taken->rfind(inner.prefix + ".", 0) == 0) {
    error(offset, fmt::format("parameter names '{}.*' are already taken", inner.prefix),
          "give this repeat its own prefix, e.g. repeat(block, n, x, prefix=\"dec\")");
    return Operand::invalid();
  }
  for (size_t i = 0; i < args.size(); ++i) inner.values[block.args[i]] = args[i];
  // The argument offsets of the calls around this copy are columns of another
  // line: an error in the body must not point there.
  struct SetAside {
    std::vector<std::pair<ir::ValueId, int>>& offsets;
    std::vector<std::pair<ir::ValueId, int>> saved;
    ~SetAside() { offsets = std::move(saved); }
  } outer_arguments{argument_offsets_, std::exchange(argument_offsets_, {})};
  int errors_before = ctx_.diag().error_count();
  declare_params(block.params, inner);
  lower_forward(block.forward, inner);
  const std::string& out_name = block.output;
  // Report once, not once per copy or per use.
  if (ctx_.diag().error_count() != errors_before) {
    failed_blocks_.insert(block.name);
    return Operand::invalid();
  }
  if (out_name.empty()) {  // no output: and the forward does not end with a single name
    ctx_.diag().error(block.loc, fmt::format("block '{}' does not say which value it returns", block.name),
                      "add output: NAME, or end its forward: with a single-name line such as '- x: ...'");
    failed_blocks_.insert(block.name);
    return Operand::invalid();
  }
  auto it = inner.values.find(out_name);
  if (it == inner.values.end()) {
    ctx_.diag().error(block.loc, fmt::format("block '{}' returns '{}', which its forward never assigns",
                                             block.name, out_name),
                      "set output: to a name assigned in the block's forward:");
    failed_blocks_.insert(block.name);
    return Operand::invalid();
  }
  return Operand::tensor(it->second, offset);
}

namespace {
// Marks a block as being instantiated for the lifetime of the guard.
struct ActiveBlock {
  std::vector<std::string>& active;
  int64_t& copies;
  int64_t count;
  ActiveBlock(std::vector<std::string>& a, int64_t& c, const std::string& name, int64_t n)
      : active(a), copies(c), count(n) {
    active.push_back(name);
    copies *= count;
  }
  ~ActiveBlock() {
    active.pop_back();
    copies /= count;
  }
  ActiveBlock(const ActiveBlock&) = delete;
  ActiveBlock& operator=(const ActiveBlock&) = delete;
};
}  // namespace

Operand Lowerer::instantiate_repeat(const BlockDef& block, int64_t count, std::vector<ir::ValueId> args,
                                    const std::string& prefix, int offset) {
  if (!check_block_use(block, "repeats", offset)) return Operand::invalid();
  // A repeat inside a block instance is named under that instance
  // (blocks.0.sub.1.w), so every outer copy gets its own inner parameters.
  const std::string qualified_prefix = scope_ ? scope_->qualified(prefix) : prefix;
  if (count < 1) {
    error(offset, fmt::format("repeat needs a positive count, got {}", count),
          "repeat(block, n, x) chains n >= 1 copies of the block");
    return Operand::invalid();
  }
  // Each copy is lowered in full, so a typo like 1000000000 would hang the compiler.
  constexpr int64_t kMaxRepeat = 10000;
  if (count > kMaxRepeat) {
    error(offset, fmt::format("repeat count {} is too large: napkin stamps out each copy, at most {}", count,
                              kMaxRepeat),
          "check the count; the deepest published transformers have about a hundred layers");
    return Operand::invalid();
  }
  // Inside a block's copies each copy repeats again: the counts multiply.
  if (count > kMaxRepeat / repeat_copies_) {
    error(offset, fmt::format("repeat count {} inside {} copies of block '{}' makes {} copies, more than napkin's "
                              "limit of {}", count, repeat_copies_, active_blocks_.back(), count * repeat_copies_,
                              kMaxRepeat),
          "nested repeats multiply: lower the counts, or unroll the outer block");
    return Operand::invalid();
  }
  ActiveBlock active(active_blocks_, repeat_copies_, block.name, count);
  for (int64_t i = 0; i < count; ++i) {
    Operand out = lower_block_copy(block, args, fmt::format("{}.{}", qualified_prefix, i), offset);
    if (!out.ok()) return out;
    const ir::TensorType &takes = type(args[0]), &gives = type(out.value);
    if (!gives.same_shape(takes) || gives.dtype != takes.dtype) {
      std::string what = block.args.size() == 1 ? "the shape it takes"
                                                 : fmt::format("the shape of its first argument '{}'", block.args[0]);
      error(offset, fmt::format("repeat needs block '{}' to return {}: it takes {} and returns {}", block.name, what,
                                ir::to_string(takes), ir::to_string(gives)),
            "each copy's output feeds the next copy: project back to the input's shape at the end of the block");
      return Operand::invalid();
    }
    args[0] = out.value;
  }
  return Operand::tensor(args[0], offset);
}

Operand Lowerer::instantiate_call(const BlockDef& block, std::vector<ir::ValueId> args, int offset) {
  if (!check_block_use(block, "calls", offset)) return Operand::invalid();
  // Calls are numbered per block and per enclosing instance (layer.0, layer.1,
  // blocks.2.layer.0), skipping names a repeat with the same prefix took.
  const std::string qualified_prefix = scope_ ? scope_->qualified(block.name) : block.name;
  int64_t& next = block_calls_[qualified_prefix];
  auto taken = [&](int64_t i) {
    std::string start = fmt::format("{}.{}.", qualified_prefix, i);
    auto it = param_names_.lower_bound(start);
    return it != param_names_.end() && it->rfind(start, 0) == 0;
  };
  while (taken(next)) ++next;
  std::string prefix = fmt::format("{}.{}", qualified_prefix, next++);
  ActiveBlock active(active_blocks_, repeat_copies_, block.name, 1);
  return lower_block_copy(block, args, prefix, offset);
}

}  // namespace napkin::frontend
