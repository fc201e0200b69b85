#include "frontend/lowering.h"

#include <fmt/format.h>

#include <cmath>

#include "frontend/suggest.h"
#include "ir/internal_check.h"

namespace napkin::frontend {

using ir::Op;
using ir::ValueId;

Lowerer::Lowerer(ir::Graph& g, YamlContext& ctx, const DimTable& dims,
                 const std::map<std::string, BlockDef>& blocks)
    : g_(g), ctx_(ctx), dims_(dims), blocks_(blocks), b_(g) {}

void Lowerer::error(int offset, std::string message, std::string hint) {
  ctx_.diag().error(base_.shifted(offset), std::move(message), std::move(hint));
}

Operand Lowerer::wrap(const ir::Built& b, int offset) {
  if (!b.ok()) {
    error(offset, b.error, b.hint);
    return Operand::invalid();
  }
  return Operand::tensor(b.value, offset);
}

Lowerer::ArgumentScope::ArgumentScope(Lowerer& L, const CallArgs& args) : L_(L), size_(L.argument_offsets_.size()) {
  for (const auto& [name, o] : args.named)
    if (o.kind == Operand::Kind::Tensor) L.argument_offsets_.emplace_back(o.value, o.offset);
  for (const Operand& o : args.rest)
    if (o.kind == Operand::Kind::Tensor) L.argument_offsets_.emplace_back(o.value, o.offset);
}

Operand Lowerer::build(Op op, std::vector<ValueId> inputs, ir::Attrs attrs, int offset) {
  ir::Built b = builder_at(offset).add(op, inputs, std::move(attrs));
  if (!b.ok() && b.blame >= 0 && b.blame < static_cast<int>(inputs.size())) {
    // The innermost call that passed the blamed tensor says where it was written.
    for (auto it = argument_offsets_.rbegin(); it != argument_offsets_.rend(); ++it)
      if (it->first == inputs[b.blame]) {
        offset = it->second;
        break;
      }
  }
  return wrap(b, offset);
}

std::vector<std::string> Lowerer::visible_names() const {
  std::vector<std::string> names;
  if (scope_)
    for (const auto& [n, v] : scope_->values) names.push_back(n);
  if (scope_ && scope_->top)
    for (const auto& [n, v] : scope_->top->values) names.push_back(n);  // the model's params among them
  for (const auto& n : dims_.order) names.push_back(n);
  return names;
}

std::optional<ValueId> Lowerer::need_tensor(const Operand& o, const std::string& what) {
  switch (o.kind) {
    case Operand::Kind::Tensor: return o.value;
    case Operand::Kind::Invalid: return std::nullopt;  // already reported
    case Operand::Kind::Word: {
      std::string hint = scope_ && scope_->in_block()
                             ? "a block sees its arguments, its own params and forward names, the model's "
                               "inputs, params and forward names assigned before its call, and dims"
                             : "define it under inputs:, params: or earlier in forward:";
      error(o.offset, fmt::format("undefined name '{}'{}", o.text, did_you_mean(o.text, visible_names())), hint);
      return std::nullopt;
    }
    case Operand::Kind::List:
      error(o.offset, fmt::format("{} must be a tensor, but this is a list of {} values", what, o.items.size()),
            fmt::format("assign a list to {} names, e.g. '- a, b: split(x, 2)', or concat(...) it", o.items.size()));
      return std::nullopt;
    default:
      error(o.offset, fmt::format("{} must be a tensor", what),
            "pass an input, a parameter or a name assigned earlier in forward:");
      return std::nullopt;
  }
}

ir::DType Lowerer::common_dtype(const Operand& a, const Operand& b) const {
  if (a.kind == Operand::Kind::Tensor) return type(a.value).dtype;
  if (b.kind == Operand::Kind::Tensor) return type(b.value).dtype;
  return ir::DType::F32;
}

std::optional<ValueId> Lowerer::to_tensor(const Operand& o, ir::DType dtype, const std::string& what) {
  if (o.kind != Operand::Kind::Number) return need_tensor(o, what);
  if (ir::is_integer(dtype) && !o.integer) {
    error(o.offset, fmt::format("{}: the number {} is not an integer but the other operand is {}", what,
                                o.number, ir::dtype_name(dtype)),
          "cast the tensor with cast(x, f32)");
    return std::nullopt;
  }
  ir::Builder& b = builder_at(o.offset);
  return b.must(b.constant(o.number, dtype));
}

std::optional<int64_t> Lowerer::need_int(const Operand& o, const std::string& what) {
  // Integers beyond 2^53 are not exact in a double, and no size or index is that big.
  if (o.kind == Operand::Kind::Number && o.integer && std::fabs(o.number) <= 9007199254740992.0)
    return static_cast<int64_t>(o.number);
  if (o.ok())
    error(o.offset, fmt::format("{} must be an integer{}", what, o.integer ? " below 2^53" : ""),
          "write a whole number such as 2 or -1, or a dim");
  return std::nullopt;
}

std::optional<double> Lowerer::need_number(const Operand& o, const std::string& what) {
  if (o.kind == Operand::Kind::Number) return o.number;
  if (o.ok()) error(o.offset, fmt::format("{} must be a number", what), "write a number such as 0.5, or a dim");
  return std::nullopt;
}

std::optional<std::string> Lowerer::need_word(const Operand& o, const std::string& what) {
  if (o.kind == Operand::Kind::Word || o.kind == Operand::Kind::String) return o.text;
  if (o.ok()) error(o.offset, fmt::format("{} must be a name or a string", what), "write a bare word or a quoted string");
  return std::nullopt;
}

std::optional<int64_t> Lowerer::need_axis(const Operand& o, int rank, const std::string& what) {
  auto axis = need_int(o, what);
  if (!axis) return axis;
  int64_t a = *axis < 0 ? *axis + rank : *axis;
  if (a < 0 || a >= rank) {
    error(o.offset, fmt::format("{} {} is out of range for a tensor with {} axes", what, *axis, rank),
          fmt::format("use -{}..{}", rank, rank - 1));
    return std::nullopt;
  }
  return a;
}

// ---- expressions -------------------------------------------------------------

Operand Lowerer::eval(const Expr& e) {
  switch (e.kind) {
    case ExprKind::Number: return Operand::num(e.number, e.is_integer, e.offset);
    case ExprKind::String: {
      Operand o;
      o.kind = Operand::Kind::String;
      o.text = e.text;
      o.offset = e.offset;
      return o;
    }
    case ExprKind::Name: return eval_name(e);
    case ExprKind::Call: return eval_call(e);
    case ExprKind::Unary: return eval_unary(e);
    case ExprKind::Binary: return eval_binary(e);
    case ExprKind::List: {
      Operand o;
      o.kind = Operand::Kind::List;
      o.offset = e.offset;
      for (const ExprPtr& item : e.args) {
        Operand v = eval(*item);
        if (!v.ok()) return Operand::invalid();
        o.items.push_back(std::move(v));
      }
      return o;
    }
    case ExprKind::Subscript: return eval_subscript(e);
  }
  return Operand::invalid();
}

Operand Lowerer::eval_name(const Expr& e) {
  if (scope_) {
    if (auto it = scope_->values.find(e.text); it != scope_->values.end())
      return Operand::tensor(it->second, e.offset);
    if (scope_->failed.count(e.text)) return Operand::invalid();  // its definition's error is reported
    // A block sees the model's parameters: every copy uses the same tensor.
    // (A later line of the block that assigns the name is an error of its own.)
    if (scope_->in_block()) {
      if (auto it = model_params_.find(e.text); it != model_params_.end())
        return Operand::tensor(it->second, e.offset);
      if (model_params_failed_.count(e.text)) return Operand::invalid();  // its declaration's error is reported
    }
    if (auto it = scope_->defined_later.find(e.text); it != scope_->defined_later.end()) {
      error(e.offset, fmt::format("'{}' is used before it is defined (on line {})", e.text, it->second),
            "forward: runs top to bottom; move this line below the definition");
      return Operand::invalid();
    }
    // Behind the block's own names: the model's inputs and forward names as
    // they are at the block's call (every copy of a repeat reads the same value).
    if (const Scope* top = scope_->top) {
      if (auto it = top->values.find(e.text); it != top->values.end()) return Operand::tensor(it->second, e.offset);
      if (top->failed.count(e.text)) return Operand::invalid();
      if (auto it = top->defined_later.find(e.text); it != top->defined_later.end()) {
        std::string when = it->second == scope_->call_line
                               ? std::string("on that line itself")
                               : fmt::format("only on line {}", it->second);
        error(e.offset,
              fmt::format("'{}' is not yet assigned at the block's call on line {}: the model assigns it {}", e.text,
                          scope_->call_line, when),
              "a block reads a top-level name as it is at the call: call the block below the line that assigns "
              "it, or pass the value as an argument");
        return Operand::invalid();
      }
    }
  }
  if (auto it = dims_.sizes.find(e.text); it != dims_.sizes.end())
    return Operand::num(static_cast<double>(it->second), true, e.offset, e.text);
  if (dims_.failed.count(e.text)) return Operand::invalid();
  Operand word;
  word.kind = Operand::Kind::Word;
  word.text = e.text;
  word.offset = e.offset;
  return word;
}

namespace {

std::optional<Op> binary_op(const std::string& token) {
  static const std::map<std::string, Op> ops = {
      {"+", Op::Add},      {"-", Op::Sub},        {"*", Op::Mul},     {"/", Op::Div},
      {"**", Op::Pow},     {"@", Op::MatMul},     {"<", Op::Less},    {"<=", Op::LessEqual},
      {">", Op::Greater},  {">=", Op::GreaterEqual}, {"==", Op::Equal}, {"!=", Op::NotEqual}};
  auto it = ops.find(token);
  if (it == ops.end()) return std::nullopt;
  return it->second;
}

// Folds arithmetic on two compile-time numbers (dims and literals).
std::optional<Operand> fold_numbers(const std::string& op, const Operand& a, const Operand& b, int offset) {
  double x = a.number, y = b.number;
  bool both_int = a.integer && b.integer;
  if (op == "+") return Operand::num(x + y, both_int, offset);
  if (op == "-") return Operand::num(x - y, both_int, offset);
  if (op == "*") return Operand::num(x * y, both_int, offset);
  if (op == "/") return Operand::num(x / y, both_int && y != 0 && std::fmod(x, y) == 0, offset);
  if (op == "//") return Operand::num(std::floor(x / y), both_int, offset);
  if (op == "%") {
    // Python semantics, as in dims: the result takes the divisor's sign.
    double r = std::fmod(x, y);
    if (r != 0 && (r < 0) != (y < 0)) r += y;
    return Operand::num(r, both_int, offset);
  }
  if (op == "**") return Operand::num(std::pow(x, y), both_int && y >= 0, offset);
  return std::nullopt;
}

}  // namespace

Operand Lowerer::eval_binary(const Expr& e) {
  Operand a = eval(*e.args[0]);
  Operand b = eval(*e.args[1]);
  if (!a.ok() || !b.ok()) return Operand::invalid();
  const std::string& token = e.text;
  if (a.kind == Operand::Kind::Number && b.kind == Operand::Kind::Number) {
    if ((token == "/" || token == "//" || token == "%") && b.number == 0) {
      error(e.args[1]->offset, "division by zero", "the divisor is a constant that is 0");
      return Operand::invalid();
    }
    if (auto folded = fold_numbers(token, a, b, e.offset)) return *folded;
  }
  std::optional<Op> op = binary_op(token);
  if (!op) {
    error(e.op_offset, fmt::format("operator '{}' works on numbers and dims only, not on tensors", token),
          "on tensors use + - * / ** @ and the comparisons");
    return Operand::invalid();
  }
  // A number takes the dtype of the tensor on the other side.
  ir::DType dtype = common_dtype(a, b);
  std::string what = fmt::format("operand of '{}'", token);
  auto x = to_tensor(a, dtype, what);
  auto y = to_tensor(b, dtype, what);
  if (!x || !y) return Operand::invalid();
  return build(*op, {*x, *y}, {}, e.op_offset);  // a shape error points at the operator
}

Operand Lowerer::eval_unary(const Expr& e) {
  Operand a = eval(*e.args[0]);
  if (!a.ok()) return a;
  if (e.text == "+") return a;
  if (a.kind == Operand::Kind::Number) return Operand::num(-a.number, a.integer, e.offset);
  auto x = need_tensor(a, "operand of '-'");
  if (!x) return Operand::invalid();
  return build(Op::Neg, {*x}, {}, e.offset);
}

Operand Lowerer::eval_call(const Expr& e) { return lower_call(*this, e); }

Operand Lowerer::eval_subscript(const Expr& e) {
  Operand base = eval(*e.args[0]);
  auto x = need_tensor(base, "the subscripted value");
  if (!x) return Operand::invalid();
  ValueId current = *x;
  int axis = 0;  // axis of `current` the next subscript item applies to
  for (const SliceItem& item : e.slices) {
    int rank = type(current).rank();
    if (axis >= rank) {
      error(item.offset, fmt::format("too many indices for a tensor with {} axes: {}", type(*x).rank(),
                                     ir::to_string(type(*x))),
            "give at most one index or slice per axis, e.g. x[0] or x[:, 1:3]");
      return Operand::invalid();
    }
    int64_t size = type(current).dims[axis].size;
    auto bound = [&](const ExprPtr& p, int64_t fallback) -> std::optional<int64_t> {
      if (!p) return fallback;
      auto v = need_int(eval(*p), "an index");
      if (!v) return v;
      return *v < 0 ? *v + size : *v;
    };
    // Checked here rather than left to the op's shape rule so that the message can
    // show the index as written and the hint the valid range.
    const ir::Dim dim = type(current).dims[axis];  // a copy: eval() below may grow the value table
    if (!item.is_slice) {
      auto index = bound(item.start, 0);
      if (!index) return Operand::invalid();
      if (*index < 0 || *index >= size) {
        error(item.offset,
              fmt::format("index {} is out of range for axis {} of size {}", *index < 0 ? *index - size : *index,
                          axis, ir::describe_dim(dim)),
              fmt::format("use an index in -{}..{}", size, size - 1));
        return Operand::invalid();
      }
      Operand r = build(Op::Select, {current}, {{"axis", int64_t{axis}}, {"index", *index}}, item.offset);
      if (!r.ok()) return r;
      current = r.value;  // the axis is gone; the next item applies to the same position
      continue;
    }
    auto start = bound(item.start, 0), stop = bound(item.stop, size);
    if (!start || !stop) return Operand::invalid();
    if (*start < 0 || *stop > size || *start >= *stop) {
      error(item.offset, fmt::format("slice {}:{} is empty or out of range for axis {} of size {}", *start, *stop,
                                     axis, ir::describe_dim(dim)),
            fmt::format("use start < stop within 0..{} (negative numbers count from the end)", size));
      return Operand::invalid();
    }
    if (*start != 0 || *stop != size) {
      Operand r = build(Op::Slice, {current},
                        {{"axis", int64_t{axis}}, {"start", *start}, {"stop", *stop}}, item.offset);
      if (!r.ok()) return r;
      current = r.value;
    }
    ++axis;
  }
  return Operand::tensor(current, e.offset);
}

// ---- statements --------------------------------------------------------------

Operand Lowerer::eval_in(const YAML::Node& node, Scope& scope, const std::string& what) {
  ExprPtr expr = ctx_.parse_scalar_expr(node, what);
  if (!expr) return Operand::invalid();
  Frame frame(*this, &scope, ctx_.text_loc(node));
  return eval(*expr);
}

Operand Lowerer::lower_scalar(const YAML::Node& node, Scope& scope, const std::string& what) {
  Operand result = eval_in(node, scope, what);
  if (!result.ok() || result.kind == Operand::Kind::Tensor) return result;
  // A bare word (an undefined name) or a number: report it at the expression,
  // which eval_in no longer points at, so the error keeps its line and column.
  Frame frame(*this, &scope, ctx_.text_loc(node));
  need_tensor(result, what);
  return Operand::invalid();
}

bool Lowerer::assign(const YAML::Node& key, const Operand& value, Scope& scope) {
  TargetList targets = parse_targets(key.Scalar());
  ir::SourceLoc key_loc = ctx_.text_loc(key);
  // Every way out with an error (already reported) leaves the names failed, so
  // later uses stay silent instead of reporting "undefined name" or using a stale value.
  auto fail = [&] {
    for (const auto& [name, offset] : targets.names) {
      scope.values.erase(name);
      scope.failed.insert(name);
    }
    return false;
  };
  for (const ParseError& err : targets.errors)
    ctx_.diag().error(key_loc.shifted(err.offset), err.message,
                      "the left side is a name, or names separated by commas: '- q, k, v: split(x, 3)'");
  if (!targets.errors.empty()) return fail();
  for (const auto& [name, offset] : targets.names) {
    scope.defined_later.erase(name);
    bool model_param = scope.in_block() && (model_params_.count(name) || model_params_failed_.count(name));
    bool clash = dims_.has(name) || param_names_.count(scope.qualified(name)) || model_param;
    if (clash) {
      ctx_.diag().error(key_loc.shifted(offset),
                        fmt::format("'{}' is already a {}; choose another name", name,
                                    dims_.has(name) ? "dim" : model_param ? "parameter of the model" : "parameter"),
                        "forward names may be reassigned, but not dims or parameters");
      return fail();
    }
  }
  if (!value.ok()) return fail();
  std::vector<ValueId> results;
  if (targets.names.size() == 1) {
    std::optional<ValueId> v;
    if (value.kind == Operand::Kind::Number) {
      ir::Builder& b = builder_located(key_loc);
      v = b.must(b.constant(value.number, ir::DType::F32));
    } else {
      v = need_tensor(value, fmt::format("the value of '{}'", targets.names[0].first));
    }
    if (!v) return fail();
    results.push_back(*v);
  } else if (value.kind == Operand::Kind::List) {
    if (value.items.size() != targets.names.size()) {
      ctx_.diag().error(key_loc, fmt::format("{} names on the left but the right side gives {} values",
                                             targets.names.size(), value.items.size()),
                        fmt::format("write {} names separated by commas, one per value", value.items.size()));
      return fail();
    }
    for (const Operand& item : value.items) {
      auto v = need_tensor(item, "each value of a multiple assignment");
      if (!v) return fail();
      results.push_back(*v);
    }
  } else {
    // a, b, c: x  unbinds the leading axis of x (free views).
    auto v = need_tensor(value, "the right side of a multiple assignment");
    if (!v) return fail();
    const ir::TensorType& t = type(*v);
    if (t.rank() == 0 || t.dims[0].size != static_cast<int64_t>(targets.names.size())) {
      ctx_.diag().error(key_loc,
                        fmt::format("{} names on the left but the leading axis of {} has size {}",
                                    targets.names.size(), ir::to_string(t), t.rank() ? t.dims[0].size : 0),
                        "the leading axis is split into one value per name");
      return fail();
    }
    ir::Builder& b = builder_located(key_loc);
    for (size_t i = 0; i < targets.names.size(); ++i)
      results.push_back(b.must(b.add(Op::Select, {*v}, {{"axis", int64_t{0}}, {"index", static_cast<int64_t>(i)}})));
  }
  for (size_t i = 0; i < results.size(); ++i) {
    const std::string& name = targets.names[i].first;
    ir::Value& v = g_.value(results[i]);
    if (v.kind == ir::ValueKind::Result && v.name.empty()) v.name = scope.qualified(name);
    scope.values[name] = results[i];
    scope.failed.erase(name);
  }
  return true;
}

bool Lowerer::lower_forward(const YAML::Node& list, Scope& scope) {
  if (!list.IsSequence()) {
    ctx_.error(list, "forward must be a list of '- name: expression' entries",
               "start each line with '- ', e.g. '- h: relu(x)'");
    return false;
  }
  int errors_before = ctx_.diag().error_count();
  // Names assigned later, so a use before the definition gets a precise message.
  std::vector<std::pair<YAML::Node, YAML::Node>> entries;
  for (const YAML::Node& item : list) {
    if (!item.IsMap() || item.size() != 1) {
      ctx_.error(item, "each forward entry must be one 'name: expression' pair",
                 "write '- name: expression' on its own line (inside [...] or {...}, quote an expression "
                 "that has commas)");
      // Names it meant to define fail quietly, so their uses do not report "undefined name".
      if (item.IsMap())
        for (auto kv = item.begin(); kv != item.end(); ++kv)
          for (const auto& [name, off] : parse_targets(kv->first.IsScalar() ? kv->first.Scalar() : "").names)
            if (!scope.values.count(name)) scope.failed.insert(name);
      continue;
    }
    auto kv = item.begin();
    entries.emplace_back(kv->first, kv->second);
    for (const auto& [name, off] : parse_targets(kv->first.Scalar()).names)
      if (!scope.values.count(name) && !scope.defined_later.count(name))
        scope.defined_later[name] = ctx_.loc(kv->first).line;
  }
  for (const auto& [key, expr] : entries) {
    Operand value = eval_in(expr, scope, fmt::format("'{}'", key.Scalar()));
    // Errors about the value itself (an undefined word, a list for one name)
    // point into the expression, so assign sees the expression's location.
    Frame frame(*this, &scope, ctx_.text_loc(expr));
    assign(key, value, scope);  // on failure it marks the names failed
  }
  return ctx_.diag().error_count() == errors_before;
}

}  // namespace napkin::frontend
