// Reads the huggingface: section. Its parts:
//   architecture  the transformers class (config.json's architectures)
//   base_model_prefix  the base model's attribute in it, which a checkpoint
//                 of the base model alone leaves out of its tensor names
//   config        config.json's values: quoted strings, true/false/null,
//                 numbers, whole-number expressions of dims, lists, mappings
//   tensors       parameter name -> checkpoint tensor name, or
//                 {name: ..., transpose: true}; `{i}` in both stands for a
//                 block copy's index (layers.{i}.wq: model.layers.{i}.self_attn.q_proj.weight);
//                 one in the tensor name alone stacks the parameter's first
//                 axis from one tensor per index (layers.{i}.w_gate:
//                 model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight)
//   tied          checkpoint tensor -> the parameter it repeats (lm_head.weight: wte)
//   ignore        glob patterns of checkpoint tensors that are no parameters
#include "frontend/huggingface.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <iterator>
#include <map>
#include <optional>
#include <set>

#include "frontend/suggest.h"

namespace napkin::frontend {

namespace {

const std::vector<std::string> kSectionKeys = {"architecture", "base_model_prefix", "config", "tensors", "tied", "ignore"};
const std::vector<std::string> kTensorKeys = {"name", "transpose"};
// config.json keys napkin hf export writes itself.
const std::map<std::string, std::string> kWrittenByExport = {
    {"architectures", "napkin hf export writes it from architecture:"},
    {"dtype", "napkin hf export writes it from --dtype"},
    {"torch_dtype", "napkin hf export writes it from --dtype"}};

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

// A name with `{i}`-style placeholders: literal text and placeholder names,
// alternating (pieces[0] literal, pieces[1] a placeholder, ...). A placeholder
// matches a block copy's index, one or more decimal digits.
struct NamePattern {
  std::vector<std::string> pieces;
  std::set<std::string> placeholders() const {
    std::set<std::string> out;
    for (size_t i = 1; i < pieces.size(); i += 2) out.insert(pieces[i]);
    return out;
  }
};

// Parses `text`; on a mistake returns nullopt and sets `error`.
std::optional<NamePattern> parse_pattern(const std::string& text, std::string& error) {
  NamePattern p;
  std::string literal;
  std::set<std::string> seen;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '}') {
      error = "a '}' without its '{'";
      return std::nullopt;
    }
    if (text[i] != '{') {
      literal += text[i];
      continue;
    }
    size_t close = text.find('}', i);
    if (close == std::string::npos) {
      error = "a '{' without its '}'";
      return std::nullopt;
    }
    std::string name = text.substr(i + 1, close - i - 1);
    if (!is_identifier(name)) {
      error = fmt::format("'{{{}}}' is not a placeholder: write a name in braces, such as {{i}}", name);
      return std::nullopt;
    }
    if (!seen.insert(name).second) {
      error = fmt::format("the placeholder {{{}}} appears twice", name);
      return std::nullopt;
    }
    if (!p.pieces.empty() && literal.empty()) {
      error = "two placeholders next to each other: put text between them";
      return std::nullopt;
    }
    p.pieces.push_back(literal);
    p.pieces.push_back(name);
    literal.clear();
    i = close;
  }
  if (text.empty()) {
    error = "the name is empty";
    return std::nullopt;
  }
  p.pieces.push_back(literal);
  return p;
}

// Whether `name` matches pieces[k..] of `p`, binding placeholders to digits.
bool match_from(const NamePattern& p, size_t k, std::string_view name, std::map<std::string, std::string>& bound) {
  const std::string& literal = p.pieces[k];
  if (!name.starts_with(literal)) return false;
  name.remove_prefix(literal.size());
  if (k + 1 == p.pieces.size()) return name.empty();
  size_t digits = 0;
  while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[digits]))) ++digits;
  for (size_t n = digits; n >= 1; --n) {
    bound[p.pieces[k + 1]] = std::string(name.substr(0, n));
    if (match_from(p, k + 2, name.substr(n), bound)) return true;
  }
  bound.erase(p.pieces[k + 1]);
  return false;
}

// The name with each bound placeholder filled in; one not bound stays as
// written ({e} of a stacked parameter's name before its index is chosen).
std::string substitute(const NamePattern& p, const std::map<std::string, std::string>& bound) {
  std::string out;
  for (size_t i = 0; i < p.pieces.size(); ++i) {
    if (i % 2 == 0) {
      out += p.pieces[i];
      continue;
    }
    auto value = bound.find(p.pieces[i]);
    out += value != bound.end() ? value->second : "{" + p.pieces[i] + "}";
  }
  return out;
}

// A parameter name as a pattern would write it: each dotted part that is a
// number becomes {i} (layers.3.wq -> layers.{i}.wq), for suggestions and lists.
std::string generalized(const std::string& name) {
  std::string out, part;
  auto flush = [&] {
    bool number = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    out += number ? "{i}" : part;
    part.clear();
  };
  for (char c : name) {
    if (c == '.') {
      flush();
      out += '.';
    } else {
      part += c;
    }
  }
  flush();
  return out;
}

class SectionReader {
 public:
  SectionReader(YamlContext& ctx, const DimTable& dims, const ir::Graph& g) : ctx_(ctx), dims_(dims) {
    for (const ir::Param& p : g.params) {
      const ir::Value& v = g.value(p.value);
      params_.push_back(v.name);
      types_[v.name] = &v.type;
    }
  }

  std::optional<HuggingFaceMap> read(const YAML::Node& node, bool params_complete) {
    const int errors_before = ctx_.diag().error_count();
    if (!ctx_.check_keys(node, kSectionKeys, "the huggingface section")) return std::nullopt;
    HuggingFaceMap map;
    read_architecture(node, map);
    read_config(node, map);
    read_tensors(node, map, params_complete);
    read_tied(node["tied"], map);
    read_ignore(node["ignore"], map);
    check_tie_flag(map);
    if (ctx_.diag().error_count() != errors_before) return std::nullopt;
    return map;
  }

 private:
  YamlContext& ctx_;
  const DimTable& dims_;
  std::vector<std::string> params_;                       // in the model's order
  std::map<std::string, const ir::TensorType*> types_;
  // config's tie_word_embeddings key, when given (assigned once: assigning a
  // YAML::Node that refers to a node rewrites that node).
  YAML::Node tie_flag_;
  bool tie_flag_given_ = false;

  // The key `key` of the mapping `section` (where an error about its whole value points).
  static YAML::Node key_of(const YAML::Node& section, const std::string& key) {
    for (auto it = section.begin(); it != section.end(); ++it)
      if (it->first.Scalar() == key) return it->first;
    return section;
  }

  // A required key the section lacks, unless a misspelling of it stands
  // there (its unknown key is reported already: one mistake, one message).
  void missing(const YAML::Node& section, const std::string& key, const std::string& hint) {
    for (auto it = section.begin(); it != section.end(); ++it)
      if (closest_name(it->first.Scalar(), kSectionKeys) == key) return;
    ctx_.error(section, fmt::format("the huggingface section has no {}", key), hint);
  }

  void read_architecture(const YAML::Node& node, HuggingFaceMap& map) {
    const YAML::Node& a = node["architecture"];
    if (!a) {
      missing(node, "architecture",
              "add architecture: NAME, the transformers class of the model (LlamaForCausalLM, GPT2LMHeadModel)");
      return;
    }
    if (!ctx_.scalar_text(a, "architecture", map.architecture)) return;
    if (!is_identifier(map.architecture))
      ctx_.error(a, fmt::format("architecture '{}' is not a class name", map.architecture),
                 "write the transformers class, such as LlamaForCausalLM or GPT2LMHeadModel");
    const YAML::Node& prefix = node["base_model_prefix"];
    if (!prefix || !ctx_.scalar_text(prefix, "base_model_prefix", map.base_model_prefix)) return;
    if (!is_identifier(map.base_model_prefix))
      ctx_.error(prefix, fmt::format("base_model_prefix '{}' is not an attribute name", map.base_model_prefix),
                 "write the base model's attribute in the class: transformer (GPT-2), model (Llama)");
  }

  // config.json's values. A quoted scalar is a string; a plain one is true,
  // false, null, a number, or a whole-number expression of dims.
  std::optional<HfConfigValue> config_value(const YAML::Node& node, const std::string& path) {
    HfConfigValue v;
    if (node.IsNull()) return v;
    if (node.IsSequence()) {
      v.kind = HfConfigValue::Kind::List;
      bool ok = true;
      for (size_t i = 0; i < node.size(); ++i) {
        auto item = config_value(node[i], fmt::format("{}[{}]", path, i));
        if (item) v.items.push_back(std::move(*item));
        ok = ok && item;
      }
      return ok ? std::optional(v) : std::nullopt;
    }
    if (node.IsMap()) {
      if (!ctx_.check_mapping(node, path)) return std::nullopt;
      v.kind = HfConfigValue::Kind::Object;
      bool ok = true;
      for (auto it = node.begin(); it != node.end(); ++it) {
        if (!it->first.IsScalar()) continue;  // reported by check_mapping
        const std::string key = it->first.Scalar();
        if (std::find(v.keys.begin(), v.keys.end(), key) != v.keys.end()) continue;  // duplicate: reported
        auto item = config_value(it->second, path + "." + key);
        ok = ok && item;
        if (!item) continue;
        v.keys.push_back(key);
        v.items.push_back(std::move(*item));
      }
      return ok ? std::optional(v) : std::nullopt;
    }
    const std::string& text = node.Scalar();
    if (node.Tag() == "!") {  // quoted
      v.kind = HfConfigValue::Kind::String;
      v.text = text;
      return v;
    }
    if (text == "true" || text == "false") {
      v.kind = HfConfigValue::Kind::Bool;
      v.flag = text == "true";
      return v;
    }
    if (text == "null" || text == "~") return v;
    ExprPtr e = ctx_.parse_scalar_expr(node, path);
    if (!e) return std::nullopt;
    const ir::SourceLoc base = ctx_.text_loc(node);
    if (e->kind == ExprKind::Name && !dims_.has(e->text) && !dims_.failed.count(e->text)) {
      ctx_.diag().error(base, fmt::format("{}: '{}' is not a dim{}", path, e->text, did_you_mean(e->text, dims_.order)),
                        fmt::format("a string is quoted: \"{}\"; a number is a literal or an expression of dims", e->text));
      return std::nullopt;
    }
    // A literal with a point or an exponent (1e-5, 10000.0) stays a float.
    const Expr* literal = e->kind == ExprKind::Unary && e->args[0]->kind == ExprKind::Number ? e->args[0].get() : e.get();
    if (literal->kind == ExprKind::Number && !literal->is_integer) {
      v.kind = HfConfigValue::Kind::Float;
      v.number = e->kind == ExprKind::Unary && e->text == "-" ? -literal->number : literal->number;
      return v;
    }
    std::optional<int64_t> n = eval_dim_expr(*e, dims_, base, ctx_.diag());
    if (!n) return std::nullopt;
    v.kind = HfConfigValue::Kind::Int;
    v.integer = *n;
    return v;
  }

  void read_config(const YAML::Node& node, HuggingFaceMap& map) {
    const YAML::Node& c = node["config"];
    if (!c) {
      missing(node, "config", "add config: with config.json's values, at least model_type: \"llama\" (or \"gpt2\", ...)");
      return;
    }
    if (!c.IsMap()) {
      ctx_.check_mapping(c, "config");  // reports what it is instead
      return;
    }
    for (auto it = c.begin(); it != c.end(); ++it) {
      const std::string key = it->first.Scalar();
      if (auto w = kWrittenByExport.find(key); w != kWrittenByExport.end())
        ctx_.error(it->first, fmt::format("config: '{}' is not written here", key), w->second + ": delete this line");
      if (key == "tie_word_embeddings" && !tie_flag_given_) {
        tie_flag_ = it->first;
        tie_flag_given_ = true;
      }
    }
    std::optional<HfConfigValue> config = config_value(c, "config");
    if (!config) return;
    map.config = std::move(*config);
    const YAML::Node& type = c["model_type"];
    if (!type)
      ctx_.error(c, "config has no model_type",
                 "add model_type: \"llama\" (the transformers family of the architecture: \"gpt2\", \"llama\", ...)");
    else if (!type.IsScalar() || type.Tag() != "!")
      ctx_.error(type, "config: model_type must be a quoted string", "write model_type: \"llama\"");
  }

  // tensors: each entry maps every parameter its pattern matches.
  void read_tensors(const YAML::Node& node, HuggingFaceMap& map, bool params_complete) {
    const YAML::Node& t = node["tensors"];
    if (!t) {
      missing(node, "tensors", "add tensors: with a line PARAMETER: CHECKPOINT_TENSOR for each parameter");
      return;
    }
    if (!ctx_.check_mapping(t, "tensors")) return;
    std::map<std::string, HfTensor> mapped;           // by parameter
    std::map<std::string, std::string> mapped_by;         // parameter -> the key that mapped it
    std::map<std::string, std::string> hf_owner;          // checkpoint tensor -> parameter
    std::vector<std::string> candidates = params_;
    for (const std::string& p : params_) candidates.push_back(generalized(p));
    std::set<std::string> seen_keys;
    // An entry in error may have been meant for any parameter: then none is
    // reported as unmapped (one mistake, one message).
    const int errors_before = ctx_.diag().error_count();
    for (auto it = t.begin(); it != t.end(); ++it) {
      if (!it->first.IsScalar()) continue;  // reported by check_mapping
      const std::string key = it->first.Scalar();
      if (!seen_keys.insert(key).second) continue;  // duplicate: reported
      std::string error;
      std::optional<NamePattern> param_pattern = parse_pattern(key, error);
      if (!param_pattern) {
        ctx_.error(it->first, fmt::format("tensors: '{}': {}", key, error), "write a parameter name such as layers.{i}.wq");
        continue;
      }
      std::string hf_text;
      bool transpose = false;
      // Where `transpose:` was written, for a later message. Not assigned from
      // value["transpose"]: a missing key is an invalid node, which yaml-cpp
      // refuses to assign (InvalidNode), though it may be copied and tested.
      std::optional<YAML::Node> transpose_node;
      const YAML::Node value = it->second;
      if (value.IsMap()) {
        if (!ctx_.check_keys(value, kTensorKeys, fmt::format("the tensor of '{}'", key))) continue;
        if (!value["name"]) {
          ctx_.error(value, fmt::format("the tensor of '{}' has no name", key),
                     "write {name: \"model.layers.{i}.mlp.up_proj.weight\", transpose: true}");
          continue;
        }
        if (!ctx_.scalar_text(value["name"], fmt::format("the tensor name of '{}'", key), hf_text)) continue;
        if (const YAML::Node written = value["transpose"]) {
          transpose_node.emplace(written);
          const std::string& flag = written.IsScalar() ? written.Scalar() : "";
          if (flag != "true" && flag != "false") {
            ctx_.error(written, "transpose must be true or false", "transpose: true stores [a, b] as [b, a]");
            continue;
          }
          transpose = flag == "true";
        }
      } else if (!ctx_.scalar_text(value, fmt::format("the tensor of '{}'", key), hf_text)) {
        continue;
      }
      std::optional<NamePattern> hf_pattern = parse_pattern(hf_text, error);
      if (!hf_pattern) {
        ctx_.error(value, fmt::format("tensors: '{}': {}", hf_text, error),
                   "write a checkpoint tensor name such as model.layers.{i}.self_attn.q_proj.weight");
        continue;
      }
      // The tensor name holds the parameter name's placeholders and at most
      // one more, which stacks the parameter's first axis.
      const std::set<std::string> a = param_pattern->placeholders(), b = hf_pattern->placeholders();
      if (!std::includes(b.begin(), b.end(), a.begin(), a.end())) {
        ctx_.error(value,
                   fmt::format("'{}' and '{}' have different placeholders ({} and {})", key, hf_text,
                               a.empty() ? "none" : fmt::format("{{{}}}", fmt::join(a, "}, {")),
                               b.empty() ? "none" : fmt::format("{{{}}}", fmt::join(b, "}, {"))),
                   "each block copy's parameter needs a tensor of its own: use the parameter's {i} in the tensor "
                   "name too");
        continue;
      }
      std::vector<std::string> stacking;  // the tensor name's placeholders alone
      std::set_difference(b.begin(), b.end(), a.begin(), a.end(), std::back_inserter(stacking));
      if (stacking.size() > 1) {
        ctx_.error(value,
                   fmt::format("'{}' has {} placeholders that '{}' lacks ({{{}}}): one stacks the parameter's first "
                               "axis, two stack nothing",
                               hf_text, stacking.size(), key, fmt::join(stacking, "}, {")),
                   "keep one placeholder of the tensor name out of the parameter name (experts.{e}), and write the "
                   "others on both sides");
        continue;
      }
      size_t matches = 0;
      for (const std::string& param : params_) {
        std::map<std::string, std::string> bound;
        if (!match_from(*param_pattern, 0, param, bound)) continue;
        ++matches;
        if (auto done = mapped_by.find(param); done != mapped_by.end()) {
          ctx_.error(it->first, fmt::format("tensors: '{}' is mapped already, by '{}'", param, done->second),
                     "map each parameter once");
          continue;
        }
        const ir::TensorType& type = *types_.at(param);
        const bool stacked = !stacking.empty();
        if (stacked && type.rank() == 0) {
          ctx_.error(value,
                     fmt::format("tensors: '{}' is {}, a scalar: {{{}}} stacks a parameter's first axis, and it has none",
                                 param, ir::to_string(type), stacking[0]),
                     "map a scalar to one tensor: use the same placeholders on both sides");
          break;
        }
        if (transpose && type.rank() != (stacked ? 3 : 2)) {
          ctx_.error(*transpose_node,
                     stacked ? fmt::format("transpose: '{}' is {}, stacked from tensors that are not matrices", param,
                                           ir::to_string(type))
                             : fmt::format("transpose: '{}' is {}, not a matrix", param, ir::to_string(type)),
                     stacked ? "transpose swaps the two axes of each stacked tensor: the parameter needs three axes"
                             : "only a 2-D parameter can be stored transposed");
          break;
        }
        HfTensor tensor{param, substitute(*hf_pattern, bound), transpose, {}};
        if (stacked)
          for (int64_t index = 0; index < type.sizes()[0]; ++index) {
            bound[stacking[0]] = std::to_string(index);
            tensor.slices.push_back(substitute(*hf_pattern, bound));
          }
        const std::vector<std::string> names = stacked ? tensor.slices : std::vector<std::string>{tensor.hf_name};
        bool taken = false;
        for (const std::string& name : names) {
          auto owner = hf_owner.find(name);
          if (owner == hf_owner.end()) continue;
          ctx_.error(value, fmt::format("tensors: '{}' and '{}' both map to '{}'", owner->second, param, name),
                     "a checkpoint tensor holds one parameter; for a tensor that repeats another, use tied:");
          taken = true;
          break;
        }
        if (taken) break;
        for (const std::string& name : names) hf_owner[name] = param;
        mapped_by[param] = key;
        mapped[param] = std::move(tensor);
      }
      if (matches == 0 && params_complete)
        ctx_.error(it->first, fmt::format("tensors: no parameter matches '{}'{}", key, did_you_mean(key, candidates)),
                   "the model's parameters are listed by napkin ir MODEL.yaml; {i} stands for a block copy's index");
    }
    if (params_complete && ctx_.diag().error_count() == errors_before) {
      std::vector<std::string> unmapped;  // generalized, each once
      for (const std::string& p : params_)
        if (!mapped.count(p) && std::find(unmapped.begin(), unmapped.end(), generalized(p)) == unmapped.end())
          unmapped.push_back(generalized(p));
      if (!unmapped.empty())
        ctx_.error(key_of(node, "tensors"),
                   fmt::format("tensors: {} {} no checkpoint tensor: {}", unmapped.size(),
                               unmapped.size() == 1 ? "parameter has" : "parameters have", fmt::join(unmapped, ", ")),
                   "add a line PARAMETER: CHECKPOINT_TENSOR for each (a block's copies at once with {i})");
    }
    for (const std::string& p : params_)
      if (auto m = mapped.find(p); m != mapped.end()) map.tensors.push_back(m->second);
  }

  void read_tied(const YAML::Node& node, HuggingFaceMap& map) {
    if (!node) return;
    if (!ctx_.check_mapping(node, "tied")) return;
    std::set<std::string> hf_names, seen, stacked;
    for (const HfTensor& t : map.tensors) {
      hf_names.insert(t.hf_name);
      hf_names.insert(t.slices.begin(), t.slices.end());
      if (!t.slices.empty()) stacked.insert(t.param);
    }
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (!it->first.IsScalar()) continue;  // reported by check_mapping
      const std::string hf_name = it->first.Scalar();
      if (!seen.insert(hf_name).second) continue;  // duplicate: reported
      std::string param;
      if (!ctx_.scalar_text(it->second, fmt::format("the parameter '{}' is tied to", hf_name), param)) continue;
      if (hf_names.count(hf_name)) {
        ctx_.error(it->first, fmt::format("tied: '{}' is a parameter's own tensor in tensors:", hf_name),
                   "a tied tensor repeats another parameter's: list it in one place");
        continue;
      }
      if (!types_.count(param)) {
        ctx_.error(it->second, fmt::format("tied: '{}' is not a parameter{}", param, did_you_mean(param, params_)),
                   "name the parameter whose tensor this one repeats, such as wte");
        continue;
      }
      if (stacked.count(param)) {
        ctx_.error(it->second,
                   fmt::format("tied: '{}' is stacked from one checkpoint tensor per index, not one tensor to repeat",
                               param),
                   "tie a tensor to a parameter the checkpoint holds whole");
        continue;
      }
      map.tied.push_back({hf_name, param});
    }
  }

  void read_ignore(const YAML::Node& node, HuggingFaceMap& map) {
    if (!node) return;
    if (!node.IsSequence()) {
      ctx_.error(node, "ignore must be a list of patterns",
                 "write ignore: [\"*.rotary_emb.inv_freq\"] (* matches any run of characters)");
      return;
    }
    for (const YAML::Node& pattern : node) {
      std::string text;
      if (!ctx_.scalar_text(pattern, "an ignore pattern", text)) continue;
      if (text.empty()) {
        ctx_.error(pattern, "an ignore pattern is empty", "write a glob such as \"*.attn.bias\"");
        continue;
      }
      map.ignore.push_back(text);
    }
  }

  // config's tie_word_embeddings, when given, must say what tied: says;
  // transformers would otherwise tie (or untie) the head on its own.
  void check_tie_flag(const HuggingFaceMap& map) {
    if (!tie_flag_given_) return;
    for (size_t i = 0; i < map.config.keys.size(); ++i) {
      if (map.config.keys[i] != "tie_word_embeddings") continue;
      const HfConfigValue& v = map.config.items[i];
      if (v.kind != HfConfigValue::Kind::Bool)
        ctx_.error(tie_flag_, "config: tie_word_embeddings must be true or false",
                   "napkin hf export writes it from tied: when the line is left out");
      else if (v.flag != !map.tied.empty())
        ctx_.error(tie_flag_,
                   v.flag ? "config: tie_word_embeddings is true, but tied: names no tensor"
                          : fmt::format("config: tie_word_embeddings is false, but tied: names {}", map.tied[0].hf_name),
                   "transformers ties the output head to the embedding when it is true: say the same in both, or "
                   "leave tie_word_embeddings out (export writes it from tied:)");
    }
  }
};

}  // namespace

std::optional<HuggingFaceMap> read_huggingface(const YAML::Node& node, YamlContext& ctx, const DimTable& dims,
                                               const ir::Graph& g, bool params_complete) {
  return SectionReader(ctx, dims, g).read(node, params_complete);
}

}  // namespace napkin::frontend
