// What the frontend accepts as a model file before it reads any section: a
// regular file (not a directory, FIFO or device: driver_test runs those) of at most
// kMaxModelFileBytes, UTF-8 text without the control characters YAML
// forbids, and one YAML document. Each refusal names the real problem.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "frontend/frontend.h"
#include "support/test_io.h"
#include "support/test_models.h"

using namespace napkin;
using napkin::testing::compile_errors;
using napkin::testing::TempDir;

namespace {

const char* kModel = R"yaml(inputs: {x: {shape: [4]}}
params: {w: {shape: [4], init: zeros}}
loss: mean(x * w)
optimizer: sgd(lr=0.1)
)yaml";

// The rendered errors of load_model_file(path); CHECKs that it failed.
std::string file_errors(const std::string& path) {
  ir::Diagnostics diag;
  CHECK_FALSE(frontend::load_model_file(path, diag).has_value());
  CHECK(diag.error_count() == 1);
  return diag.render();
}

}  // namespace

TEST_CASE("model file: a regular file reads - a missing one says why it cannot be opened") {
  TempDir dir("model-file");
  napkin::testing::write_bytes(dir / "m.yaml", kModel);
  ir::Diagnostics diag;
  CHECK(frontend::load_model_file(dir / "m.yaml", diag).has_value());
  CHECK_FALSE(diag.has_errors());
  std::string out = file_errors(dir / "missing.yaml");
  CHECK(out.find("missing.yaml: error: cannot open the model file: No such file or directory") != std::string::npos);
}

TEST_CASE("model file: a directory is refused as a directory - not as a YAML mapping") {
  TempDir dir("model-file");
  std::string out = file_errors(dir.path);
  CHECK(out.find("error: the model path is a directory, not a file") != std::string::npos);
  CHECK(out.find("mapping") == std::string::npos);
}

TEST_CASE("model file: a file over the size limit is refused - one at the limit is read") {
  TempDir dir("model-file");
  auto sparse = [&](const std::string& name, off_t size) {
    int fd = ::open((dir / name).c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, size) == 0);
    ::close(fd);
    return dir / name;
  };
  CHECK(frontend::kMaxModelFileBytes == 16 << 20);
  std::string over = file_errors(sparse("over.yaml", frontend::kMaxModelFileBytes + 1));
  CHECK(over.find("error: the model file is larger than the limit of 16 MiB (16777216 bytes) for a model file: "
                  "it has 16777217 bytes") != std::string::npos);
  // At the limit the file is read, and its zeros are what is wrong.
  std::string at = file_errors(sparse("at.yaml", frontend::kMaxModelFileBytes));
  CHECK(at.find("at.yaml:1:1: error: the model file holds a NUL byte here") != std::string::npos);
  CHECK(at.size() < 1000);  // the quoted line is a window of the 16 MiB of zeros
}

TEST_CASE("model file: one YAML document - a second after --- or ... is an error at its start") {
  // A leading --- and a closing ... belong to the one document.
  ir::Diagnostics diag;
  CHECK(frontend::load_model_text(std::string("---\n") + kModel + "...\n", "m.yaml", diag).has_value());
  CHECK_FALSE(diag.has_errors());
  // '---' inside a quoted or block scalar is text, not a marker.
  CHECK(frontend::load_model_text(std::string(kModel) + "description: |\n  ---\n  two\nmodel: \"a\n ---\"\n", "m.yaml",
                                  diag)
            .has_value());
  CHECK_FALSE(diag.has_errors());

  CHECK(compile_errors(std::string(kModel) + "---\nloss: mean(x)\n")
            .find("inline.yaml:5:1: error: a model file holds one YAML document; this is a second one") !=
        std::string::npos);
  // After '...' a document needs no '---': it starts at its first token.
  CHECK(compile_errors(std::string(kModel) + "...\n# two\n  loss: mean(x)\n")
            .find("inline.yaml:7:3: error: a model file holds one YAML document; this is a second one") !=
        std::string::npos);
  // A second document with a syntax error of its own is still reported as a second document.
  std::string broken = compile_errors(std::string(kModel) + "--- \nloss: [mean(x)\n");
  CHECK(broken.find("inline.yaml:5:1: error: a model file holds one YAML document") != std::string::npos);
  CHECK(broken.find("1 error generated.") != std::string::npos);
  // An empty first document does not hide the second.
  CHECK(compile_errors(std::string("---\n---\n") + kModel)
            .find("inline.yaml:2:1: error: a model file holds one YAML document") != std::string::npos);
}

TEST_CASE("model file: control characters YAML forbids are reported at their byte - tab and CR are text") {
  CHECK(compile_errors("model: a\x7f\n").find("inline.yaml:1:9: error: the model file holds the control character "
                                              "\\x7f here") != std::string::npos);
  // A C1 control (U+009B, a CSI to some terminals) after a two-byte character: the column counts bytes.
  CHECK(compile_errors("model: \xc3\xa9\xc2\x9b\n")
            .find("inline.yaml:1:10: error: the model file holds the control character U+009B here") !=
        std::string::npos);
  CHECK(compile_errors("model: a\x0c\n").find("inline.yaml:1:9: error: the model file holds the control character "
                                              "\\x0c") != std::string::npos);
  CHECK(compile_errors("model: \xed\xa0\x80\n").find("inline.yaml:1:8: error: the model file is not valid UTF-8 here") !=
        std::string::npos);  // a surrogate
  ir::Diagnostics diag;
  std::string crlf;
  for (char c : std::string(kModel) + "description: \"a\tb\"\n") crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  CHECK(frontend::load_model_text(crlf, "m.yaml", diag).has_value());
  CHECK_FALSE(diag.has_errors());
}

TEST_CASE("model file: a 10 MB line is quoted as a window in the error") {
  std::string huge(10 << 20, 'a');
  std::string out = compile_errors(std::string(kModel) + "zzz: " + huge + "\n");
  CHECK(out.find("inline.yaml:5:1: error: unknown key 'zzz' in the model") != std::string::npos);
  CHECK(out.find("    zzz: aaaa") != std::string::npos);
  CHECK(out.size() < 2000);
}
