#include "tools/huggingface.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "ir/glob.h"
#include "ir/internal_check.h"
#include "ir/quantities.h"
#include "runtime/checkpoint.h"
#include "runtime/error.h"
#include "runtime/float_formats.h"
#include "runtime/sharded_checkpoint.h"
#include "tools/files.h"
#include "tools/huggingface_files.h"

namespace napkin::tools {

namespace {

using ir::DType;
using runtime::Error;

// "f32[768, 2304]".
std::string type_text(DType dtype, const std::vector<int64_t>& shape) {
  return runtime::tensor_type_text(ir::dtype_name(dtype), shape);
}

// A piece's shape (napkin's layout) as the checkpoint stores it: reversed when transposed.
std::vector<int64_t> checkpoint_shape(std::vector<int64_t> shape, bool transpose) {
  if (transpose) std::swap(shape[0], shape[1]);
  return shape;
}

size_t element_count(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// One checkpoint tensor and where it lies in its parameter: all of it, or
// one index along the first axis of a parameter the checkpoint holds as one
// tensor per index (frontend::HfTensor::slices).
struct Piece {
  size_t tensor;               // its parameter: an index into the map's tensors
  std::string hf_name;
  std::vector<int64_t> shape;  // in napkin's layout: the parameter's, or a slice's (no first axis)
  size_t offset;               // elements into the parameter
  int64_t index;               // along the stacked axis; -1 for a whole parameter
};

// Every checkpoint tensor of the map: parameter by parameter, slices by index.
std::vector<Piece> pieces_of(const frontend::HuggingFaceMap& map, const std::vector<ir::TensorType>& types) {
  std::vector<Piece> pieces;
  for (size_t i = 0; i < map.tensors.size(); ++i) {
    const frontend::HfTensor& m = map.tensors[i];
    const std::vector<int64_t> shape = types[i].sizes();
    if (m.slices.empty()) {
      pieces.push_back({i, m.hf_name, shape, 0, -1});
      continue;
    }
    const std::vector<int64_t> slice(shape.begin() + 1, shape.end());
    for (size_t e = 0; e < m.slices.size(); ++e)
      pieces.push_back({i, m.slices[e], slice, e * element_count(slice), static_cast<int64_t>(e)});
  }
  return pieces;
}

// "h.0.attn_w (f32[768, 2304], transposed)", "index 3 of layers.0.w_gate
// (f32[4, 24, 16], stacked on its first axis)"; ", transposed" when
// `say_transposed` and the map transposes it.
std::string piece_text(const Piece& p, const frontend::HfTensor& m, const ir::TensorType& type, bool say_transposed) {
  return fmt::format("{}{} ({}{}{})", p.index < 0 ? "" : fmt::format("index {} of ", p.index), m.param,
                     type_text(type.dtype, type.sizes()), p.index < 0 ? "" : ", stacked on its first axis",
                     say_transposed && m.transpose ? ", transposed" : "");
}

// For a tensor no piece names: the stacked parameter whose name pattern it
// fits at an index beyond the parameter's first axis (the dims are likely
// wrong), as a clause for the message; "" for none.
std::string beyond_stack(const std::string& name, const frontend::HuggingFaceMap& map) {
  for (const frontend::HfTensor& m : map.tensors) {
    if (m.slices.empty()) continue;
    // The frontend left one placeholder in a stacked tensor's hf_name, and a
    // name's braces are placeholders only.
    const size_t open = m.hf_name.find('{'), close = m.hf_name.find('}');
    const std::string prefix = m.hf_name.substr(0, open), suffix = m.hf_name.substr(close + 1);
    if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix)) continue;
    const std::string index = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (index.find_first_not_of("0123456789") != std::string::npos) continue;
    return fmt::format("; {} stacks {} tensors (indices 0 to {}) at these dims: are the dims (--dims) those of the "
                       "checkpoint?",
                       m.param, m.slices.size(), m.slices.size() - 1);
  }
  return "";
}

// Whether every value of `from` is a value of `to`: the widenings import makes.
bool holds_exactly(DType to, DType from) {
  if (to == from) return true;
  if (to == DType::F64) return from == DType::F32 || from == DType::BF16 || from == DType::F16;
  if (to == DType::F32) return from == DType::BF16 || from == DType::F16;
  return false;
}

// The floating dtypes a checkpoint tensor may have for a parameter of `to`.
std::string exact_sources(DType to) {
  switch (to) {
    case DType::F64: return "f64, f32, bf16 or f16";
    case DType::F32: return "f32, bf16 or f16";
    default: return std::string(ir::dtype_name(to));
  }
}

double load(DType t, const char* data, size_t i) {
  switch (t) {
    case DType::F64: {
      double v;
      std::memcpy(&v, data + 8 * i, 8);
      return v;
    }
    case DType::F32: {
      float v;
      std::memcpy(&v, data + 4 * i, 4);
      return v;
    }
    case DType::BF16:
    case DType::F16: {
      uint16_t bits;
      std::memcpy(&bits, data + 2 * i, 2);
      return t == DType::BF16 ? runtime::bf16_bits_to_float(bits) : runtime::f16_bits_to_float(bits);
    }
    default: NAPKIN_INTERNAL_CHECK(false, "napkin hf converts f64, f32, bf16 and f16 only");
  }
  return 0;
}

// Rounds to nearest even (through f32 for the 16-bit formats).
void store(DType t, char* data, size_t i, double v) {
  switch (t) {
    case DType::F64: std::memcpy(data + 8 * i, &v, 8); return;
    case DType::F32: {
      const float f = static_cast<float>(v);
      std::memcpy(data + 4 * i, &f, 4);
      return;
    }
    case DType::BF16:
    case DType::F16: {
      const float f = static_cast<float>(v);
      const uint16_t bits = t == DType::BF16 ? runtime::float_to_bf16_bits(f) : runtime::float_to_f16_bits(f);
      std::memcpy(data + 2 * i, &bits, 2);
      return;
    }
    default: NAPKIN_INTERNAL_CHECK(false, "napkin hf converts f64, f32, bf16 and f16 only");
  }
}

// Copies a tensor of `rows` x `cols` elements (one row of all of them for a
// vector) from dtype `from` to `to`; with `transpose`, `src` is laid out
// [cols, rows] and `dst` [rows, cols]. Returns how many finite values became
// infinite (a narrowing that overflowed).
int64_t convert(const char* src, DType from, char* dst, DType to, size_t rows, size_t cols, bool transpose) {
  const size_t n = rows * cols;
  if (from == to && !transpose) {
    if (n > 0) std::memcpy(dst, src, n * static_cast<size_t>(ir::dtype_size(to)));
    return 0;
  }
  const bool narrows = !holds_exactly(to, from);
  int64_t overflowed = 0;
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) {
      const size_t out = r * cols + c;
      const double v = load(from, src, transpose ? c * rows + r : out);
      store(to, dst, out, v);
      if (narrows && std::isfinite(v) && !std::isfinite(load(to, dst, out))) ++overflowed;
    }
  return overflowed;
}

// rows x cols of a piece's shape as convert() reads it: a matrix's two
// axes, else everything in one row.
std::pair<size_t, size_t> matrix_of(const std::vector<int64_t>& s) {
  if (s.size() == 2) return {static_cast<size_t>(s[0]), static_cast<size_t>(s[1])};
  return {1, element_count(s)};
}

// The type of each mapped parameter, in the map's order.
std::vector<ir::TensorType> param_types(const frontend::HuggingFaceModel& model) {
  const ir::Graph& g = model.graph;
  std::map<std::string, const ir::TensorType*> by_name;
  for (const ir::Param& p : g.params) by_name[g.value(p.value).name] = &g.value(p.value).type;
  std::vector<ir::TensorType> types;
  for (const frontend::HfTensor& m : model.map.tensors) {
    auto it = by_name.find(m.param);
    NAPKIN_INTERNAL_CHECK(it != by_name.end(), "the huggingface map names a parameter the model does not have");
    types.push_back(*it->second);
  }
  return types;
}

// "a, b, c" or "a, b, ... (N in all)".
std::string name_list(const std::vector<std::string>& names, size_t shown = 8) {
  if (names.size() <= shown) return fmt::format("{}", fmt::join(names, ", "));
  return fmt::format("{}, ... ({} in all)", fmt::join(names.begin(), names.begin() + static_cast<long>(shown), ", "),
                     names.size());
}

nlohmann::ordered_json config_json(const frontend::HfConfigValue& v) {
  using Kind = frontend::HfConfigValue::Kind;
  switch (v.kind) {
    case Kind::Null: return nullptr;
    case Kind::Bool: return v.flag;
    case Kind::Int: return v.integer;
    case Kind::Float: return v.number;
    case Kind::String: return v.text;
    case Kind::List: {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (const frontend::HfConfigValue& item : v.items) out.push_back(config_json(item));
      return out;
    }
    case Kind::Object: {
      nlohmann::ordered_json out = nlohmann::ordered_json::object();
      for (size_t i = 0; i < v.keys.size(); ++i) out[v.keys[i]] = config_json(v.items[i]);
      return out;
    }
  }
  return nullptr;
}

// transformers' name of a dtype (config.json's dtype and torch_dtype).
const char* torch_dtype(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    default: NAPKIN_INTERNAL_CHECK(false, "napkin hf export writes f32, bf16 or f16");
  }
  return "";
}

}  // namespace

std::string import_huggingface(const frontend::HuggingFaceModel& model, const std::string& hf_path,
                               const std::string& output) {
  const ir::Graph& g = model.graph;
  const frontend::HuggingFaceMap& map = model.map;
  const std::vector<ir::TensorType> types = param_types(model);
  const std::vector<Piece> pieces = pieces_of(map, types);
  const HfCheckpoint checkpoint(hf_path);
  if (std::string problem = output_problem("-o", output, checkpoint.paths()); !problem.empty()) throw Error(problem);
  std::vector<std::string> problems;

  // A checkpoint of the base model alone (GPT2Model's, as the original GPT-2
  // files are) names no tensor with the base model's prefix: its names are
  // read with the prefix, as from_pretrained reads them.
  const std::string prefix = map.base_model_prefix.empty() ? "" : map.base_model_prefix + ".";
  bool headless = !prefix.empty() && !checkpoint.tensors().empty();
  for (const HfCheckpoint::Tensor* t : checkpoint.tensors()) headless = headless && !t->name.starts_with(prefix);
  std::map<std::string, const HfCheckpoint::Tensor*> named;  // by the section's names
  for (const HfCheckpoint::Tensor* t : checkpoint.tensors()) named[(headless ? prefix : "") + t->name] = t;
  auto find = [&](const std::string& name) -> const HfCheckpoint::Tensor* {
    auto it = named.find(name);
    return it == named.end() ? nullptr : it->second;
  };

  // What each of the checkpoint's tensors is: a parameter's, a tied copy, ignored, or unexpected.
  std::set<std::string> known;
  for (const Piece& p : pieces) known.insert(p.hf_name);
  for (const frontend::HfTied& t : map.tied) known.insert(t.hf_name);
  std::vector<std::string> ignored;
  for (const auto& entry : named) {
    const std::string& name = entry.first;
    const HfCheckpoint::Tensor* t = entry.second;
    if (known.count(name)) continue;
    bool skip = false;
    for (const std::string& pattern : map.ignore) skip = skip || ir::glob_match(pattern, name);
    if (skip)
      ignored.push_back(name);
    else
      problems.push_back(fmt::format("unexpected: {} ({}) is no tensor of this model, and no ignore: pattern matches it{}",
                                     runtime::printable(name), runtime::tensor_type_text(t->dtype, t->shape),
                                     beyond_stack(name, map)));
  }

  // Each piece's tensor: present, its shape, a dtype that widens exactly.
  std::vector<const HfCheckpoint::Tensor*> sources;  // by piece
  for (const Piece& p : pieces) {
    const frontend::HfTensor& m = map.tensors[p.tensor];
    const ir::TensorType& type = types[p.tensor];
    const std::vector<int64_t> want = checkpoint_shape(p.shape, m.transpose);
    // "[2304, 768] in f32, bf16 or f16 for h.0.attn_w (f32[768, 2304], transposed)"
    const std::string expected = fmt::format("{} in {} for {}", runtime::tensor_type_text("", want),
                                             exact_sources(type.dtype), piece_text(p, m, type, true));
    const HfCheckpoint::Tensor* t = find(p.hf_name);
    sources.push_back(t);
    if (!t) {
      problems.push_back(fmt::format("missing: {}, expected {}", p.hf_name, expected));
      continue;
    }
    const std::optional<DType> found = ir::parse_dtype(t->dtype);
    const bool dtype_ok = found && holds_exactly(type.dtype, *found);
    if (t->shape != want || !dtype_ok)
      problems.push_back(fmt::format("wrong {}: {} is {}, expected {}",
                                     t->shape != want ? (dtype_ok ? "shape" : "shape and dtype") : "dtype", p.hf_name,
                                     runtime::tensor_type_text(t->dtype, t->shape), expected));
  }

  // A tied tensor the checkpoint holds must be the one it repeats, bit for bit.
  std::vector<std::string> tied_checked;
  for (const frontend::HfTied& tie : map.tied) {
    const HfCheckpoint::Tensor* copy = find(tie.hf_name);
    if (!copy) continue;  // save_pretrained leaves tied tensors out
    for (size_t i = 0; i < pieces.size(); ++i) {  // the frontend ties whole parameters only
      const HfCheckpoint::Tensor* original = sources[i];
      if (map.tensors[pieces[i].tensor].param != tie.param || !original) continue;
      if (copy->dtype != original->dtype || copy->shape != original->shape ||
          std::memcmp(copy->data, original->data, copy->bytes) != 0)
        problems.push_back(fmt::format(
            "tied: {} ({}) differs from {} ({}), which this model ties it to ({}); a model whose head is not tied needs "
            "a parameter of its own for it",
            tie.hf_name, runtime::tensor_type_text(copy->dtype, copy->shape), pieces[i].hf_name,
            runtime::tensor_type_text(original->dtype, original->shape), tie.param));
      else
        tied_checked.push_back(fmt::format("{} = {}", tie.hf_name, pieces[i].hf_name));
    }
  }
  if (!problems.empty())
    throw_problems(fmt::format("{}: does not match {}'s huggingface: section", hf_path, g.name), problems);

  // Every tensor copied out of the mapped files before anything is written.
  std::vector<std::vector<char>> buffers(map.tensors.size());
  std::vector<runtime::TensorData> views;
  for (size_t i = 0; i < map.tensors.size(); ++i) {
    const ir::TensorType& type = types[i];
    buffers[i].resize(element_count(type.sizes()) * static_cast<size_t>(ir::dtype_size(type.dtype)));
    views.push_back({map.tensors[i].param, std::string(ir::dtype_name(type.dtype)), type.sizes(), buffers[i].data()});
  }
  std::map<std::string, int> widened;  // "bf16" -> tensors widened from it
  int64_t elements = 0;
  int transposed = 0, stacked = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const frontend::HfTensor& m = map.tensors[p.tensor];
    const DType to = types[p.tensor].dtype;
    const DType from = *ir::parse_dtype(sources[i]->dtype);
    const auto [rows, cols] = matrix_of(p.shape);
    convert(sources[i]->data, from, buffers[p.tensor].data() + p.offset * static_cast<size_t>(ir::dtype_size(to)), to,
            rows, cols, m.transpose);
    if (from != to) ++widened[sources[i]->dtype];
    elements += static_cast<int64_t>(rows * cols);
    transposed += m.transpose;
    stacked += p.index >= 0;
  }
  checkpoint.check_intact();
  std::map<std::string, std::string> metadata = {
      {"source", "huggingface"}, {"architecture", map.architecture}, {"model", g.name}};
  if (!g.config.train.dims.empty()) metadata["dims"] = g.config.train.dims;
  runtime::write_safetensors_file_atomically(output, views, metadata);

  std::string done = fmt::format("wrote {}: {} parameter tensors of {} ({} parameters) from {}{}\n", output,
                                 views.size(), g.name, ir::with_commas(static_cast<double>(elements)), hf_path,
                                 checkpoint.paths().size() > 1 ? fmt::format(" ({} shards)", checkpoint.paths().size()) : "");
  if (headless)
    done += fmt::format("  read the base model's tensors as {}NAME: the checkpoint's names lack that prefix\n", prefix);
  for (const auto& [dtype, count] : widened) done += fmt::format("  widened {} {} tensors exactly\n", count, dtype);
  if (stacked > 0) {
    int stacks = 0;
    for (const frontend::HfTensor& m : map.tensors) stacks += !m.slices.empty();
    done += fmt::format("  stacked {} tensors into {} parameters on their first axis\n", stacked, stacks);
  }
  if (transposed > 0) done += fmt::format("  transposed {} tensors to napkin's layout\n", transposed);
  for (const std::string& t : tied_checked) done += fmt::format("  tied {}: equal, read once\n", t);
  if (!ignored.empty())
    done += fmt::format("  note: ignored {} tensors that are no parameters (the section's ignore: patterns): {}\n",
                        ignored.size(), name_list(ignored));
  return done;
}

std::string export_huggingface(const frontend::HuggingFaceModel& model, const std::string& checkpoint_path,
                               const std::string& dir, DType dtype) {
  // A directory of checkpoints: its newest.
  std::string checkpoint = checkpoint_path;
  if (std::error_code ec; std::filesystem::is_directory(checkpoint_path, ec) && !runtime::is_sharded_checkpoint(checkpoint_path)) {
    const auto all = runtime::list_checkpoints(checkpoint_path);
    if (all.empty())
      throw Error(fmt::format("{}: a directory without checkpoints (step-N.safetensors); name a checkpoint or weights "
                              "file, or train the model first",
                              checkpoint_path));
    checkpoint = all.front().second;
  }
  if (runtime::is_sharded_checkpoint(checkpoint))
    throw Error(fmt::format("{}: a sharded checkpoint (one file per rank); make it one file first: napkin checkpoint "
                            "consolidate {} -o FILE.safetensors",
                            checkpoint, checkpoint));
  const ir::Graph& g = model.graph;
  const frontend::HuggingFaceMap& map = model.map;
  const std::vector<ir::TensorType> types = param_types(model);
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw Error(fmt::format("-o {}: is a file; napkin hf export writes a directory (config.json, model.safetensors)", dir));
  // transformers prefers model.safetensors to an index, but other loaders
  // read the index when there is one: an old sharded checkpoint beside the
  // export would be loaded in its place.
  if (fs::exists(fs::path(dir) / "model.safetensors.index.json", ec))
    throw Error(fmt::format("-o {}: holds model.safetensors.index.json, the index of another (sharded) checkpoint, which "
                            "a loader that reads the index would load instead of this export; export into a new "
                            "directory, or remove that checkpoint first",
                            dir));
  const std::string weights = (fs::path(dir) / "model.safetensors").string();
  const std::string config_path = (fs::path(dir) / "config.json").string();
  for (const std::string& output : {weights, config_path})
    if (std::string problem = output_problem("-o", output, {checkpoint}); !problem.empty()) throw Error(problem);
  // A napkin checkpoint also holds the optimizer's state: skipped. Any other
  // file must hold the parameters alone.
  std::vector<std::string> optimizer_state;
  {
    const runtime::SafetensorsFile file(checkpoint);
    std::set<std::string> params;
    for (const frontend::HfTensor& m : map.tensors) params.insert(m.param);
    if (runtime::is_napkin_checkpoint(file))
      for (const runtime::SafetensorsFile::Tensor& t : file.tensors())
        if (!params.count(t.name)) optimizer_state.push_back(t.name);
  }
  std::vector<std::vector<char>> params(map.tensors.size());
  std::vector<runtime::TensorRef> refs;
  for (size_t i = 0; i < map.tensors.size(); ++i) {
    const ir::TensorType& type = types[i];
    params[i].resize(element_count(type.sizes()) * static_cast<size_t>(ir::dtype_size(type.dtype)));
    refs.push_back({map.tensors[i].param, std::string(ir::dtype_name(type.dtype)), type.sizes(), params[i].data()});
  }
  runtime::read_weights(checkpoint, refs, optimizer_state);

  const std::vector<Piece> pieces = pieces_of(map, types);
  std::vector<std::vector<char>> tensors(pieces.size());
  std::vector<runtime::TensorData> views;
  std::vector<std::string> problems;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const frontend::HfTensor& m = map.tensors[p.tensor];
    const ir::TensorType& type = types[p.tensor];
    const auto [napkin_rows, napkin_cols] = matrix_of(p.shape);
    // convert() writes [rows, cols] from [cols, rows] when transposing.
    const size_t rows = m.transpose ? napkin_cols : napkin_rows, cols = m.transpose ? napkin_rows : napkin_cols;
    tensors[i].resize(rows * cols * static_cast<size_t>(ir::dtype_size(dtype)));
    const char* from = params[p.tensor].data() + p.offset * static_cast<size_t>(ir::dtype_size(type.dtype));
    if (int64_t overflowed = convert(from, type.dtype, tensors[i].data(), dtype, rows, cols, m.transpose))
      problems.push_back(fmt::format("{}: {} finite values are too large for {}", piece_text(p, m, type, false),
                                     overflowed, ir::dtype_name(dtype)));
    views.push_back({p.hf_name, std::string(ir::dtype_name(dtype)), checkpoint_shape(p.shape, m.transpose),
                     tensors[i].data()});
  }
  if (!problems.empty())
    throw_problems(fmt::format("{}: cannot be exported in {}", checkpoint, ir::dtype_name(dtype)), problems);

  nlohmann::ordered_json config = {{"architectures", {map.architecture}}};
  bool tie_given = false;
  const nlohmann::ordered_json section = config_json(map.config);
  for (const auto& [key, value] : section.items()) {
    config[key] = value;
    tie_given = tie_given || key == "tie_word_embeddings";
  }
  if (!tie_given) config["tie_word_embeddings"] = !map.tied.empty();
  // transformers 4.56 renamed torch_dtype to dtype and warns about the old
  // key unless the new one is there too; older versions read torch_dtype only.
  config["dtype"] = torch_dtype(dtype);
  config["torch_dtype"] = torch_dtype(dtype);

  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("-o {}: cannot create the directory: {}", dir, ec.message()));
  runtime::write_safetensors_file_atomically(weights, views, {{"format", "pt"}});
  if (std::string error = write_atomically(config_path, config.dump(2) + "\n"); !error.empty()) throw Error(error);

  int64_t elements = 0;
  for (const runtime::TensorData& t : views) elements += static_cast<int64_t>(element_count(t.shape));
  std::string done = fmt::format("wrote {} and {}: {} tensors of {} ({} parameters) in {} for {} from {}\n", weights,
                                 config_path, views.size(), g.name, ir::with_commas(static_cast<double>(elements)),
                                 ir::dtype_name(dtype), map.architecture, checkpoint);
  if (!optimizer_state.empty())
    done += fmt::format("  left out the optimizer state ({} tensors)\n", optimizer_state.size());
  for (const frontend::HfTied& t : map.tied)
    done += fmt::format("  left out {}: tied to {} (tie_word_embeddings), as save_pretrained does\n", t.hf_name, t.param);
  return done;
}

}  // namespace napkin::tools
