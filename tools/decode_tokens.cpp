#include "tools/decode_tokens.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "runtime/dataset.h"
#include "runtime/error.h"
#include "runtime/mapped_file.h"
#include "runtime/tokenizer.h"
#include "tools/files.h"

namespace napkin::tools {

bool decode_token_file(const DecodeOptions& o, std::ostream& out, std::string& error) {
  if (error = input_problem(o.input); !error.empty()) return false;
  try {
    std::optional<tokenizer::Tokenizer> tok;
    if (!o.tokenizer.empty()) tok = tokenizer::Tokenizer::load(o.tokenizer);
    const int64_t vocab = tok ? tok->vocab_size() : 256;
    const std::string dtype = !o.dtype.empty() ? o.dtype : vocab <= 65536 ? "u16" : "u32";
    const runtime::MappedFile file(o.input);
    const runtime::TokenFileLayout layout = runtime::token_file_layout(
        o.input, file.data(), file.size(), runtime::parse_token_dtype(o.input, dtype));
    if (o.first > layout.count) {
      error = fmt::format("--first {}: {} holds {} ids", o.first, o.input, runtime::with_commas(layout.count));
      return false;
    }
    const int64_t end = o.count < 0 ? layout.count : std::min(layout.count, o.first + o.count);
    const char* ids = file.data() + layout.offset;
    const int64_t width = runtime::element_bytes(layout.dtype);
    std::string text;
    for (int64_t i = o.first; i < end; ++i) {
      const int64_t id = runtime::read_token_id(ids + i * width, layout.dtype);
      if (id < 0 || id >= vocab) {
        out << text;
        error = fmt::format("{}: id {} at position {} is not in the {} vocabulary [0, {}){}", o.input, id,
                            runtime::with_commas(i), tok ? o.tokenizer + "'s" : "byte", vocab,
                            tok ? "" : ": give the --tokenizer the file was encoded with");
        return false;
      }
      if (tok) text += tok->token_bytes(static_cast<int32_t>(id));
      else text += static_cast<char>(id);
      if (text.size() >= (1u << 20)) {  // streamed: a corpus is not held as text
        out << text;
        text.clear();
      }
    }
    out << text;
    out.flush();
    return true;
  } catch (const runtime::Error& e) {
    error = e.what();
    return false;
  }
}

}  // namespace napkin::tools
