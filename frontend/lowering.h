// Lowering of forward expressions to IR. Internal to frontend/.
//
// An expression evaluates to an Operand: a tensor (an IR value), a compile-time
// number (literals and dims fold: sqrt(head_dim) is 8.0, not a node), a string
// (einops patterns), a list, or a bare word (f32, tanh) that only some argument
// slots accept. Every IR node gets the location of the expression text that
// made it; every error is reported there and evaluation goes on with an
// Invalid operand, so one mistake does not cascade into many messages.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "frontend/dims.h"
#include "frontend/expr_ast.h"
#include "frontend/yaml_context.h"
#include "ir/builder.h"
#include "ir/graph.h"

namespace napkin::frontend {

struct Operand {
  enum class Kind { Invalid, Tensor, Number, String, List, Word };
  Kind kind = Kind::Invalid;
  ir::ValueId value = ir::kNoValue;  // Tensor
  double number = 0;                 // Number
  bool integer = false;              // Number: exact integer (a literal without '.', or a dim)
  std::string text;                  // String, Word; Number: the dim's name when it came from one
  std::vector<Operand> items;        // List
  int offset = 0;                    // where in the expression string it starts

  bool ok() const { return kind != Kind::Invalid; }
  static Operand invalid() { return {}; }
  static Operand tensor(ir::ValueId v, int offset) {
    Operand o;
    o.kind = Kind::Tensor;
    o.value = v;
    o.offset = offset;
    return o;
  }
  static Operand num(double v, bool integer, int offset, std::string dim_name = "") {
    Operand o;
    o.kind = Kind::Number;
    o.number = v;
    o.integer = integer;
    o.offset = offset;
    o.text = std::move(dim_name);
    return o;
  }
};

struct BlockDef {
  std::string name;
  YAML::Node params;
  YAML::Node forward;
  std::vector<std::string> args;
  YAML::Node args_node;  // the args: list as written (absent: the default [x]), for messages
  std::string output;  // "" : the last name assigned
  ir::SourceLoc loc;
  bool failed = false;  // its definition has an error (reported); repeat() of it is silent
};

// Names visible to an expression. A block body gets a fresh scope for its
// arguments, its own params and forward names; behind them it sees the model's
// params (Lowerer::model_params_) and the top-level scope as it stands at the
// block's call (inputs and forward names assigned before it), then dims.
struct Scope {
  std::string prefix;  // "blocks.3" inside a block instance; "" at top level
  std::map<std::string, ir::ValueId> values;
  std::map<std::string, int> defined_later;  // forward names not yet assigned -> line
  // Names whose definition failed (already reported): a use evaluates to Invalid
  // silently, so one mistake gives one message, not one per use ("undefined name").
  std::set<std::string> failed;
  // Inside a block: the model's top-level scope, and the line of the top-level
  // call that lowers this copy (the outermost one when blocks nest). Lowering
  // is in forward order, so `top` holds exactly the values bound at that call.
  const Scope* top = nullptr;
  int call_line = 0;
  std::string qualified(const std::string& name) const { return prefix.empty() ? name : prefix + "." + name; }
  bool in_block() const { return !prefix.empty(); }
};

class Lowerer;

// Arguments of one call, bound to the callee's parameter names.
struct CallArgs {
  std::map<std::string, Operand> named;       // bound parameters
  std::vector<Operand> rest;                  // the positionals past a variadic call's fixed ones
  std::map<std::string, Operand> extra;       // extra keywords (rearrange's axis sizes)
  const Operand* get(const std::string& name) const {
    auto it = named.find(name);
    return it == named.end() ? nullptr : &it->second;
  }
};

class Lowerer {
 public:
  Lowerer(ir::Graph& g, YamlContext& ctx, const DimTable& dims, const std::map<std::string, BlockDef>& blocks);

  // Lowers a `forward:` list into `scope`. Returns false if anything failed.
  bool lower_forward(const YAML::Node& list, Scope& scope);
  // Evaluates one expression scalar (loss:) in `scope`.
  Operand lower_scalar(const YAML::Node& node, Scope& scope, const std::string& what);

  // ---- used by the call table and the einops lowering ----
  // Records the tensor arguments of a call for the duration of its lowering.
  class ArgumentScope {
   public:
    ArgumentScope(Lowerer& L, const CallArgs& args);
    ~ArgumentScope() { L_.argument_offsets_.resize(size_); }
    ArgumentScope(const ArgumentScope&) = delete;
    ArgumentScope& operator=(const ArgumentScope&) = delete;

   private:
    Lowerer& L_;
    size_t size_;
  };
  Operand eval(const Expr& e);
  void error(int offset, std::string message, std::string hint = "");
  // The file column of `offset` in the expression being lowered (0: unknown).
  int column(int offset) const { return base_.col > 0 ? base_.col + offset : 0; }
  // Adds a node at `offset`; a shape/dtype error is reported there.
  Operand build(ir::Op op, std::vector<ir::ValueId> inputs, ir::Attrs attrs, int offset);
  Operand wrap(const ir::Built& b, int offset);
  // The dtype a number takes next to `a` and `b`: that of the first tensor among
  // them (f32 if neither is one), so 2 * x stays in x's dtype.
  ir::DType common_dtype(const Operand& a, const Operand& b) const;
  // Converts an operand to a tensor; numbers become constants of `dtype`.
  std::optional<ir::ValueId> to_tensor(const Operand& o, ir::DType dtype, const std::string& what);
  // Requires a tensor; reports "expected a tensor" or "undefined name" otherwise.
  std::optional<ir::ValueId> need_tensor(const Operand& o, const std::string& what);
  std::optional<int64_t> need_int(const Operand& o, const std::string& what);
  std::optional<double> need_number(const Operand& o, const std::string& what);
  std::optional<std::string> need_word(const Operand& o, const std::string& what);  // String or Word
  // Normalizes a possibly negative axis against `rank`.
  std::optional<int64_t> need_axis(const Operand& o, int rank, const std::string& what);

  const ir::TensorType& type(ir::ValueId v) const { return g_.value(v).type; }
  // The builder, located at `offset` of the current expression (or at `loc`):
  // every node it makes from here on carries that YAML location and the scope
  // of the block instance being lowered.
  ir::Builder& builder_at(int offset) { return builder_located(base_.shifted(offset)); }
  ir::Builder& builder_located(const ir::SourceLoc& loc) {
    b_.set_loc(loc);
    b_.set_scope(scope_ ? scope_->prefix : "");
    return b_;
  }

  // Where expressions are evaluated: the scope names resolve in and the YAML
  // location of offset 0. A Frame sets both and restores the previous ones when
  // it goes out of scope, on every path.
  class Frame {
   public:
    Frame(Lowerer& L, Scope* scope, ir::SourceLoc base)
        : L_(L), scope_(std::exchange(L.scope_, scope)), base_(std::exchange(L.base_, std::move(base))) {}
    ~Frame() {
      L_.scope_ = scope_;
      L_.base_ = std::move(base_);
    }
    Frame(const Frame&) = delete;
    Frame& operator=(const Frame&) = delete;

   private:
    Lowerer& L_;
    Scope* scope_;
    ir::SourceLoc base_;
  };
  // repeat(block, n, x, ...): `count` chained copies named prefix.0, prefix.1,
  // ...; copy i gets the output of copy i-1 as its first argument and the
  // same `args[1:]` as every other copy.
  Operand instantiate_repeat(const BlockDef& block, int64_t count, std::vector<ir::ValueId> args,
                             const std::string& prefix, int offset);
  // block(x, ...): one copy, named <block>.<k> with the first k not yet taken.
  Operand instantiate_call(const BlockDef& block, std::vector<ir::ValueId> args, int offset);
  const std::map<std::string, BlockDef>& blocks() const { return blocks_; }

  // The routers of the moe() layers lowered so far, in forward order: what
  // the loss terms moe_load_balance() and moe_z_loss() pool (frontend/moe.cpp).
  struct MoeRouting {
    int64_t experts = 0, tokens = 0;
    ir::ValueId counts = ir::kNoValue;           // f32 [E]: top-k assignments per expert
    ir::ValueId probs_sum = ir::kNoValue;        // f32 [E]: router probabilities summed over the tokens
    ir::ValueId lse_squared_sum = ir::kNoValue;  // f32 scalar: Σ_t logsumexp(logits_t)²
  };
  std::vector<MoeRouting>& moe_routing() { return moe_routing_; }

  // Declares the parameters of a `params:` mapping into `scope` (names get the
  // scope's prefix). Init arguments are compile-time numbers: normal(1 / sqrt(d)).
  bool declare_params(const YAML::Node& params, Scope& scope);

 private:
  ir::Graph& g_;
  YamlContext& ctx_;
  const DimTable& dims_;
  const std::map<std::string, BlockDef>& blocks_;
  ir::Builder b_;
  Scope* scope_ = nullptr;
  // Tensor arguments of the calls being lowered and where each was written, so
  // an op's error that blames one input points at that argument, not the call.
  std::vector<std::pair<ir::ValueId, int>> argument_offsets_;
  ir::SourceLoc base_;  // location of offset 0 of the expression being lowered
  // Every parameter name declared so far: 10000 repeated copies check every
  // name they assign, so a scan of the graph's params would be quadratic.
  std::set<std::string> param_names_;
  // Elements of all parameters so far, capped at 2^50 like one tensor: the
  // parameter count and bytes are int64 sums, and 10000 copies of a 2^50-element
  // parameter would overflow them.
  double param_elements_ = 0;
  // Blocks being instantiated, outermost first: a block that repeats itself
  // (directly or through another block) would recurse until the stack overflows.
  std::vector<std::string> active_blocks_;
  // Copies of the innermost block being instantiated, nesting included: nested
  // repeats multiply, and their product is capped like a single count.
  int64_t repeat_copies_ = 1;
  // The model's (top-level) parameters, which every block sees by name, so that
  // all copies of a block share one tensor; and the ones whose declaration
  // failed (reported), whose uses stay silent.
  std::map<std::string, ir::ValueId> model_params_;
  std::set<std::string> model_params_failed_;
  // Direct calls of blocks so far, by qualified prefix: the next call's index.
  std::map<std::string, int64_t> block_calls_;
  // Whether each block used so far has valid args: (checked at its first use).
  std::map<std::string, bool> block_args_ok_;
  // Blocks whose body had an error (reported): later uses fail silently.
  std::set<std::string> failed_blocks_;
  std::vector<MoeRouting> moe_routing_;

  // Checks that a block may be instantiated here (no recursion, nesting depth)
  // and that its args: are names that clash with nothing; false: reported.
  bool check_block_use(const BlockDef& block, const char* verb, int offset);
  // Lowers one copy of `block` in a scope named `prefix` (blocks.3) with
  // `args` bound to its args:. Returns its output, or Invalid (reported).
  Operand lower_block_copy(const BlockDef& block, const std::vector<ir::ValueId>& args, const std::string& prefix,
                           int offset);

  Operand eval_name(const Expr& e);
  Operand eval_binary(const Expr& e);
  Operand eval_unary(const Expr& e);
  Operand eval_call(const Expr& e);
  Operand eval_subscript(const Expr& e);
  Operand eval_in(const YAML::Node& node, Scope& scope, const std::string& what);
  bool assign(const YAML::Node& key, const Operand& value, Scope& scope);
  std::vector<std::string> visible_names() const;
  std::optional<ir::InitSpec> read_init(const YAML::Node& node, const std::string& param,
                                        const std::vector<ir::Dim>& shape);
};

// moe(x, router, w_gate, w_up, w_down, k, capacity_factor, routing, normalize)
// and the loss terms over its routers (frontend/moe.cpp).
Operand lower_moe(Lowerer& L, const CallArgs& a, const Expr& call);
Operand lower_moe_load_balance(Lowerer& L, const CallArgs& a, const Expr& call);
Operand lower_moe_z_loss(Lowerer& L, const CallArgs& a, const Expr& call);

// The call table (frontend/calls.cpp): every function a model may call.
Operand lower_call(Lowerer& L, const Expr& call);
std::vector<std::string> known_functions();

// The mistakes bind_arguments finds in a call's arguments.
enum class ArgumentError {
  TooMany,  // more positionals than parameters
  Unknown,  // a keyword that names no parameter
  Twice,    // a parameter given by position and again by keyword
  Missing,  // a required parameter not given
};

// How bind_arguments binds and words its errors. The unknown-keyword and
// given-twice messages are shared; the rest is the caller's (the call table
// and a parameter's init word them differently).
struct BindOptions {
  size_t variadic = 0;          // > 0: positionals after the first `variadic` go to CallArgs::rest
  bool extra_keywords = false;  // keywords that name no parameter go to CallArgs::extra
  // The first mistake ends binding, and too many positionals are reported
  // before any argument is evaluated (an init: one mistake, one message).
  // Otherwise every keyword is checked and every argument evaluated, so that
  // each mistake in them is reported.
  bool first_error_ends = false;
  // Checks an argument bound to a parameter right after it is evaluated (not
  // for an Invalid one: its error is reported); false: it failed, reported.
  // `written` is the argument's expression.
  std::function<bool(const std::string& param, const Expr& written, const Operand& value)> check;
  std::function<std::string(size_t positionals)> too_many;    // the message for ArgumentError::TooMany
  std::function<std::string(const std::string& param)> missing;  // the message for ArgumentError::Missing
  std::function<std::string(ArgumentError)> hint;             // the hint of each mistake
};

// Binds the positional and keyword arguments of `call` (a Call, or a Name: no
// arguments) to `params`, in positional order, the first `required` of which
// must be given. Evaluates each argument; nullopt if anything failed (reported).
std::optional<CallArgs> bind_arguments(Lowerer& L, const Expr& call, const std::vector<std::string>& params,
                                       size_t required, const BindOptions& options);

// einops lowering (frontend/einops_lowering.cpp). `pattern` is the String operand.
// einsum's `operands` are Tensor operands (one or more), in the pattern's order.
Operand lower_einsum(Lowerer& L, const std::vector<Operand>& operands, const Operand& pattern, int offset);
Operand lower_rearrange(Lowerer& L, ir::ValueId x, const Operand& pattern,
                        const std::map<std::string, Operand>& sizes, int offset);
// `reduction` is the String or Word operand ("sum", "mean", "max", "min").
Operand lower_reduce(Lowerer& L, ir::ValueId x, const Operand& pattern, const Operand& reduction,
                     const std::map<std::string, Operand>& sizes, int offset);

}  // namespace napkin::frontend
