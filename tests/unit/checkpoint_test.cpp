// Checkpoint I/O: the safetensors reader and writer against the format's
// byte layout (a hand-made fixture) and every validation rule, CRC-32C against
// its check value, and checkpoints: bit-exact round trips, corruption,
// truncation, the wrong model, atomic writes that fail cleanly, retention and
// discovery of the newest checkpoint.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/checkpoint.h"
#include "runtime/checkpoint_dir.h"
#include "runtime/error.h"
#include "runtime/rng.h"
#include "runtime/safetensors.h"
#include "support/test_io.h"

namespace rt = napkin::runtime;
namespace fs = std::filesystem;

namespace {

using napkin::testing::error_of;
using napkin::testing::read_bytes;
using napkin::testing::write_bytes;

// A fresh directory for one test case.
struct TempDir : napkin::testing::TempDir {
  TempDir() : napkin::testing::TempDir("ckpt-test") {}
};

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file from a header text and data bytes.
std::string st_file(const std::string& header, const std::string& data) { return u64_le(header.size()) + header + data; }

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A small model's parameters and optimizer state, filled from a seed.
struct Model {
  std::vector<float> wte = std::vector<float>(12), m_wte = std::vector<float>(12);
  std::vector<uint16_t> w = std::vector<uint16_t>(4);  // bf16 bits
  int64_t step = 0;
  std::vector<uint8_t> mask = std::vector<uint8_t>(3);

  explicit Model(uint64_t seed) {
    rt::Rng rng(seed, 0);
    for (float& v : wte) v = static_cast<float>(rng.normal());
    for (float& v : m_wte) v = static_cast<float>(rng.normal());
    for (uint16_t& v : w) v = static_cast<uint16_t>(rng.next_u32());
    step = static_cast<int64_t>(rng.next_u32());
    for (uint8_t& v : mask) v = rng.next_u32() & 1;
    if (seed == 0) return;
    uint32_t nan_bits = 0x7fc12345;  // a NaN with a payload survives bit for bit
    std::memcpy(&wte[0], &nan_bits, 4);
  }
  std::vector<rt::TensorRef> params() {
    return {{"wte", "f32", {4, 3}, wte.data()}, {"blocks.0.w", "bf16", {2, 2}, w.data()}, {"mask", "bool", {3}, mask.data()}};
  }
  std::vector<rt::TensorRef> all() {
    auto t = params();
    t.push_back({"adam.m.wte", "f32", {4, 3}, m_wte.data()});
    t.push_back({"optimizer.step", "i64", {}, &step});
    return t;
  }
  bool operator==(const Model& o) const {
    return std::memcmp(wte.data(), o.wte.data(), 48) == 0 && m_wte == o.m_wte && w == o.w && step == o.step &&
           mask == o.mask;
  }
};

const std::string kRun = "00112233aabbccdd";

// The checksum's header part as checkpoint.h defines it, written here from the
// definition: metadata but the checksum in key order, then (name, dtype,
// shape) per tensor in data order, each string after its length as 8 bytes LE.
uint32_t header_crc(const rt::SafetensorsFile& f) {
  std::string text;
  auto add = [&](const std::string& s) { text += u64_le(s.size()) + s; };
  for (const auto& [key, value] : f.metadata())
    if (key != "checksum") add(key), add(value);
  for (const auto& t : f.tensors()) {
    add(t.name);
    add(t.dtype);
    std::string dims;
    for (size_t i = 0; i < t.shape.size(); ++i) dims += (i ? "," : "") + std::to_string(t.shape[i]);
    add(dims);
  }
  return rt::crc32c(text.data(), text.size());
}

// Rewrites a checkpoint with other metadata or tensors, keeping its checksum:
// what a hand edit or a damaged header does.
void rewrite(const std::string& path, const std::function<void(std::map<std::string, std::string>&,
                                                                std::vector<rt::TensorData>&)>& edit) {
  std::map<std::string, std::string> meta;
  std::vector<rt::TensorData> tensors;
  std::vector<std::string> bytes;
  {
    rt::SafetensorsFile f(path);
    meta = f.metadata();
    for (const auto& t : f.tensors()) bytes.emplace_back(t.data, t.bytes);
    for (size_t i = 0; i < f.tensors().size(); ++i)
      tensors.push_back({f.tensors()[i].name, f.tensors()[i].dtype, f.tensors()[i].shape, bytes[i].data()});
  }
  edit(meta, tensors);
  rt::write_safetensors_file(path, tensors, meta);
}

}  // namespace

// ------------------------------------------------------------------ crc32c

TEST_CASE("checkpoint: crc32c has the Castagnoli check value and chains") {
  CHECK(rt::crc32c("123456789", 9) == 0xE3069283u);
  CHECK(rt::crc32c("", 0) == 0u);
  CHECK(rt::crc32c("6789", 4, rt::crc32c("12345", 5)) == 0xE3069283u);
  // Slicing-by-8 against the bit-at-a-time definition, at every length and alignment.
  std::vector<unsigned char> buf(1000);
  rt::Rng rng(5, 5);
  for (auto& b : buf) b = static_cast<unsigned char>(rng.next_u32());
  for (size_t start : {0, 1, 3}) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 500, 997}) {
      uint32_t c = ~0u;
      for (size_t i = start; i < start + n; ++i) {
        c ^= buf[i];
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      }
      CHECK(rt::crc32c(buf.data() + start, n) == ~c);
    }
  }
}

// ------------------------------------------------------------------ safetensors

TEST_CASE("safetensors: the writer produces the format's exact bytes, and the reader reads them") {
  TempDir dir;
  const float a[2] = {1.0f, -2.0f};
  const uint8_t b[3] = {1, 2, 3};
  rt::write_safetensors_file(dir / "t.safetensors", {{"a", "f32", {2}, a}, {"b", "u8", {3}, b}}, {{"k", "v"}});
  // 8-byte little-endian header length (136), the JSON (132 bytes) padded
  // with 4 spaces to a multiple of 8, then a's 8 bytes and b's 3.
  const std::string want =
      std::string("\x88\0\0\0\0\0\0\0", 8) +
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}}    )" +
      std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0\x01\x02\x03", 11);
  CHECK(read_bytes(dir / "t.safetensors") == want);

  // A fixture with the tensors in the other order in the header: offsets rule.
  write_bytes(dir / "f.safetensors",
              st_file(R"({"b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                      std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0\x01\x02\x03", 11)));
  for (const char* name : {"t.safetensors", "f.safetensors"}) {
    rt::SafetensorsFile f(dir / name);
    REQUIRE(f.tensors().size() == 2);
    CHECK(f.tensors()[0].name == "a");  // in data order
    CHECK(f.tensors()[0].dtype == "f32");
    CHECK(f.tensors()[0].shape == std::vector<int64_t>{2});
    CHECK(std::memcmp(f.tensors()[0].data, a, 8) == 0);
    CHECK(f.find("b")->bytes == 3);
    CHECK(std::memcmp(f.find("b")->data, b, 3) == 0);
    CHECK(f.find("c") == nullptr);
    CHECK(f.data_size() == 11);
  }
  CHECK(rt::SafetensorsFile(dir / "t.safetensors").metadata() == std::map<std::string, std::string>{{"k", "v"}});
  CHECK(rt::SafetensorsFile(dir / "f.safetensors").metadata().empty());
}

TEST_CASE("safetensors: every dtype, scalars and empty tensors round-trip") {
  TempDir dir;
  const char* dtypes[] = {"f64", "f32", "f16", "bf16", "f8e4m3", "f8e5m2", "i64", "i32",
                          "i16", "i8",  "u64", "u32", "u16",  "u8",     "bool"};
  std::vector<std::vector<unsigned char>> buffers;
  std::vector<rt::TensorData> tensors;
  rt::Rng rng(1, 2);
  for (const char* d : dtypes) {
    const size_t itemsize = *rt::safetensors_itemsize(d);
    buffers.emplace_back(6 * itemsize);
    for (auto& byte : buffers.back()) byte = static_cast<unsigned char>(rng.next_u32());
    tensors.push_back({std::string("t_") + d, d, {2, 3}, buffers.back().data()});
  }
  const double scalar = 2.5;
  tensors.push_back({"scalar", "f64", {}, &scalar});
  tensors.push_back({"empty", "f32", {0, 4}, nullptr});
  rt::write_safetensors_file(dir / "all.safetensors", tensors, {});
  CHECK(read_bytes(dir / "all.safetensors").substr(8).find("__metadata__") == std::string::npos);

  rt::SafetensorsFile f(dir / "all.safetensors");
  REQUIRE(f.tensors().size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = f.tensors()[i];
    CAPTURE(t.name);
    CHECK(t.name == tensors[i].name);
    CHECK(t.dtype == tensors[i].dtype);
    CHECK(t.shape == tensors[i].shape);
    if (t.bytes > 0) CHECK(std::memcmp(t.data, tensors[i].data, t.bytes) == 0);
  }
  CHECK(f.find("scalar")->bytes == 8);
  CHECK(f.find("empty")->bytes == 0);
  CHECK(!rt::safetensors_itemsize("f7"));
  CHECK(rt::tensor_type_text("f32", {4, 3}) == "f32[4, 3]");

  CHECK_THROWS_AS(rt::write_safetensors_file(dir / "x", {{"a", "c64", {1}, &scalar}}, {}), std::invalid_argument);
  CHECK_THROWS_AS(rt::write_safetensors_file(dir / "x", {{"a", "f64", {}, &scalar}, {"a", "f64", {}, &scalar}}, {}),
                  std::invalid_argument);
}

TEST_CASE("safetensors: the reader rejects every malformed file with a precise message") {
  TempDir dir;
  const std::string p = dir / "bad.safetensors";
  auto err = [&](const std::string& bytes) {
    write_bytes(p, bytes);
    return error_of([&] { rt::SafetensorsFile f(p); });
  };
  const std::string f32x2 = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

  CHECK(err("12345") == p + ": truncated: 5 bytes, not even the 8-byte header length");
  CHECK(err(u64_le(1000) + std::string(20, ' ')) ==
        p + ": header length 1000 exceeds the 20 bytes after it (truncated, or not a safetensors file)");
  CHECK(err(st_file("{\"a\":", "")).starts_with(p + ": header is not valid JSON: "));
  CHECK(err(st_file("[1, 2]", "")) == p + ": header is not a JSON object");
  CHECK(err(st_file(R"({"__metadata__":{"k":1}})", "")) == p + ": __metadata__ entry 'k' is not a string");
  CHECK(err(st_file(R"({"__metadata__":[]})", "")) == p + ": __metadata__ is not an object");
  CHECK(err(st_file(R"({"a":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", std::string(8, 0))) ==
        p + ": tensor 'a' has unknown or unsupported dtype 'F7'");
  CHECK(err(st_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, 0))) ==
        p + ": tensor 'a' has no dtype string");
  CHECK(err(st_file(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", std::string(8, 0))) ==
        p + ": tensor 'a' has no shape array");
  CHECK(err(st_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, 0))) ==
        p + ": tensor 'a': shape [-2] is not a list of sizes");
  CHECK(err(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", std::string(8, 0))) ==
        p + ": tensor 'a' has no data_offsets [begin, end]");
  CHECK(err(st_file(R"({"a":3})", "")) == p + ": tensor 'a' is not an object");
  CHECK(err(st_file(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", std::string(20, 0))) ==
        p + ": tensor 'a': f32[2, 3] needs 24 bytes, but data_offsets [0, 20] span 20");
  CHECK(err(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, 0))) ==
        p + ": tensor 'a': f32[2] needs 8 bytes, but data_offsets [8, 0] span a negative range");
  CHECK(err(st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                    std::string(12, 0))) ==
        p + ": tensor 'b' starts at byte 8 of the data, but 'a' ends at 4 (tensors must be laid out without gaps or overlaps)");
  CHECK(err(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                    std::string(8, 0))) ==
        p + ": tensor 'b' starts at byte 4 of the data, but 'a' ends at 8 (tensors must be laid out without gaps or overlaps)");
  CHECK(err(st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, 0))) ==
        p + ": tensor 'a' starts at byte 4 of the data, but the data section starts at 0 (tensors must be laid out "
            "without gaps or overlaps)");
  CHECK(err(st_file(f32x2, std::string(5, 0))) ==
        p + ": truncated: the header describes 8 bytes of tensor data, the file holds 5");
  CHECK(err(st_file(f32x2, std::string(9, 0))) ==
        p + ": 1 bytes after the last tensor (the header describes 8 bytes of data, the file holds 9)");
  CHECK(err(st_file(f32x2 + "   ", std::string(8, 0))) == "(no error)");  // padding is fine
}

// ------------------------------------------------------------------ checkpoints

TEST_CASE("checkpoint: a round trip is bit-exact and returns the metadata") {
  TempDir dir;
  Model saved(1);
  const std::string path = rt::write_checkpoint(dir / "ckpt", 100, saved.all(), "hash-abc", kRun, {{"model", "gpt"}, {"seed", "1"}});
  CHECK(path == dir / "ckpt/step-000100.safetensors");
  CHECK(files_in(dir / "ckpt") == std::vector<std::string>{"step-000100.safetensors"});
  CHECK((fs::status(path).permissions() & fs::perms::others_read) != fs::perms::none);

  Model loaded(0);
  CHECK(!(loaded == saved));
  auto meta = rt::read_checkpoint(path, loaded.all(), "hash-abc").metadata;
  CHECK(loaded == saved);
  CHECK(meta.at("format") == "napkin-checkpoint-2");
  CHECK(meta.at("run") == kRun);
  CHECK(meta.at("model_hash") == "hash-abc");
  CHECK(meta.at("step") == "100");
  CHECK(meta.at("model") == "gpt");
  CHECK(meta.at("seed") == "1");
  // The checksum is CRC-32C of the header's content (checkpoint.h), then
  // everything after the header.
  rt::SafetensorsFile f(path);
  char want[32];
  std::snprintf(want, sizeof want, "crc32c:%08x", rt::crc32c(f.data_section(), f.data_size(), header_crc(f)));
  CHECK(meta.at("checksum") == want);
  // Tensors are stored in the order given, under their names.
  CHECK(f.tensors()[0].name == "wte");
  CHECK(f.tensors()[4].name == "optimizer.step");
  CHECK(f.tensors()[4].shape.empty());

  CHECK(rt::checkpoint_filename(0) == "step-000000.safetensors");
  CHECK(rt::checkpoint_filename(1234567) == "step-1234567.safetensors");
  CHECK_THROWS_AS(rt::write_checkpoint(dir / "ckpt", 1, saved.all(), "h", kRun, {{"step", "5"}}), std::invalid_argument);
  CHECK_THROWS_AS(rt::write_checkpoint(dir / "ckpt", 1, saved.all(), "h", kRun, {{"run", "5"}}), std::invalid_argument);
}

TEST_CASE("checkpoint: a flipped byte, a truncated file and another model's checkpoint are clear errors") {
  TempDir dir;
  Model saved(1);
  const std::string path = rt::write_checkpoint(dir.path, 100, saved.all(), "hash-abc", kRun, {});
  const std::string good = read_bytes(path);
  Model loaded(0);

  std::string flipped = good;
  flipped[flipped.size() - 20] ^= 0x01;
  write_bytes(path, flipped);
  const std::string e = error_of([&] { rt::read_checkpoint(path, loaded.all(), "hash-abc"); });
  CHECK(e.starts_with(path + ": checksum mismatch (file is corrupt): the metadata says crc32c:"));
  CHECK(e.find(", the header and data hash to crc32c:") != std::string::npos);
  CHECK(error_of([&] { rt::read_weights(path, loaded.params()); }).starts_with(path + ": checksum mismatch"));
  CHECK(loaded == Model(0));  // nothing was copied

  write_bytes(path, good.substr(0, good.size() - 4));
  CHECK(error_of([&] { rt::read_checkpoint(path, loaded.all(), "hash-abc"); }) ==
        path + ": truncated: the header describes 115 bytes of tensor data, the file holds 111");

  write_bytes(path, good);
  CHECK(error_of([&] { rt::read_checkpoint(path, loaded.all(), "hash-xyz"); }) ==
        path + ": checkpoint was written by a different model (hash hash-abc, this trainer hash-xyz)");

  rt::write_safetensors_file(dir / "plain.safetensors", {}, {});
  CHECK(error_of([&] { rt::read_checkpoint(dir / "plain.safetensors", {}, "h"); }) ==
        dir / "plain.safetensors: not a napkin checkpoint (no 'format' in its metadata)");
}

TEST_CASE("checkpoint: missing, unexpected, wrong-shape and wrong-dtype tensors are listed together") {
  TempDir dir;
  Model saved(1);
  const std::string path = rt::write_checkpoint(dir.path, 7, saved.all(), "h", kRun, {});
  Model loaded(0);
  std::vector<float> extra(2), wide(15);
  std::vector<rt::TensorRef> into = {{"wte", "f32", {5, 3}, wide.data()},
                                     {"blocks.0.w", "f16", {2, 2}, loaded.w.data()},
                                     {"adam.m.wte", "f32", {4, 3}, loaded.m_wte.data()},
                                     {"optimizer.step", "i64", {}, &loaded.step},
                                     {"blocks.1.b", "f32", {2}, extra.data()}};
  CHECK(error_of([&] { rt::read_checkpoint(path, into, "h"); }) ==
        path + ": does not match this model (4 problems)\n"
               "  wrong shape: wte is f32[4, 3] in the file, f32[5, 3] in this model\n"
               "  wrong dtype: blocks.0.w is bf16[2, 2] in the file, f16[2, 2] in this model\n"
               "  missing: blocks.1.b (f32[2])\n"
               "  unexpected: mask (bool[3]) is not in this model");
  CHECK(loaded == Model(0));
}

TEST_CASE("checkpoint: --init weights load from any safetensors file with exactly the params") {
  TempDir dir;
  Model saved(1);
  std::vector<rt::TensorData> plain;
  for (const auto& t : saved.params()) plain.push_back({t.name, t.dtype, t.shape, t.data});
  rt::write_safetensors_file(dir / "init.safetensors", plain, {{"source", "pytorch"}});
  Model loaded(0);
  rt::read_weights(dir / "init.safetensors", loaded.params());
  CHECK(std::memcmp(loaded.wte.data(), saved.wte.data(), 48) == 0);
  CHECK(loaded.w == saved.w);
  CHECK(loaded.mask == saved.mask);

  // A full checkpoint holds optimizer state the params do not name: refused
  // unless the caller names it ignorable (the trainer names its state).
  const std::string ckpt = rt::write_checkpoint(dir / "ckpt", 1, saved.all(), "h", kRun, {});
  CHECK(error_of([&] { rt::read_weights(ckpt, loaded.params()); }) ==
        ckpt + ": does not match this model (2 problems)\n"
               "  unexpected: adam.m.wte (f32[4, 3]) is not in this model\n"
               "  unexpected: optimizer.step (i64[]) is not in this model");
  Model from_ckpt(0);
  CHECK(rt::read_weights(ckpt, from_ckpt.params(), {"adam.m.wte", "optimizer.step"}) ==
        std::vector<std::string>{"adam.m.wte", "optimizer.step"});
  CHECK(from_ckpt.w == saved.w);
  CHECK(error_of([&] { rt::read_weights(ckpt, from_ckpt.params(), {"adam.m.wte"}); }) ==
        ckpt + ": does not match this model (1 problem)\n  unexpected: optimizer.step (i64[]) is not in this model");
  auto more = loaded.params();
  more.push_back({"lm_head", "f32", {3, 4}, loaded.m_wte.data()});
  CHECK(error_of([&] { rt::read_weights(dir / "init.safetensors", more); }) ==
        dir / "init.safetensors: does not match this model (1 problem)\n  missing: lm_head (f32[3, 4])");
}

TEST_CASE("checkpoint: list_checkpoints puts the highest step first and ignores temp and other files") {
  TempDir dir;
  CHECK(rt::list_checkpoints(dir / "nope").empty());
  CHECK(rt::list_checkpoints(dir.path).empty());
  for (const char* name : {"step-000050.safetensors", "step-000100.safetensors", "step-1000000.safetensors",
                           ".tmp-step-2000000.safetensors-AbC123", "step-3000000.safetensors.bak", "notes.txt",
                           "step-.safetensors", "step-12x.safetensors"})
    write_bytes(dir / name, "");
  fs::create_directory(dir / "step-5000000.safetensors");  // not a file
  REQUIRE(!rt::list_checkpoints(dir.path).empty());
  CHECK(rt::list_checkpoints(dir.path).front().second == dir / "step-1000000.safetensors");
}

TEST_CASE("checkpoint: the header is covered by the checksum and its fields are validated") {
  TempDir dir;
  Model saved(1), loaded(0);
  const std::string path = rt::write_checkpoint(dir.path, 6, saved.all(), "h", kRun, {{"seed", "7"}});
  const std::string good = read_bytes(path);
  rt::CheckpointHeader h = rt::read_checkpoint(path, loaded.all(), "h");
  CHECK(h.step == 6);
  CHECK(h.seed == 7u);
  CHECK(h.run == kRun);
  CHECK(h.format == 2);

  // An edited value that is still valid: only the checksum can tell.
  rewrite(path, [](auto& meta, auto&) { meta["step"] = "8"; });
  Model untouched(0);
  CHECK(error_of([&] { rt::read_checkpoint(path, untouched.all(), "h"); }).starts_with(path + ": checksum mismatch"));
  // Two same-shaped tensors' data swapped by renaming: the data is unchanged, the header is not.
  write_bytes(path, good);
  rewrite(path, [](auto&, auto& tensors) { std::swap(tensors[0].name, tensors[3].name); });
  CHECK(error_of([&] { rt::read_checkpoint(path, untouched.all(), "h"); }).starts_with(path + ": checksum mismatch"));
  CHECK(untouched == Model(0));

  // Fields out of range are named, never an internal error.
  for (const char* step : {"99999999999999999999", "-5", "", "1e3", " 5", "0x10"}) {
    CAPTURE(step);
    write_bytes(path, good);
    rewrite(path, [&](auto& meta, auto&) { meta["step"] = step; });
    CHECK(error_of([&] { rt::read_checkpoint_header(path); }) ==
          path + ": metadata 'step' is \"" + step + "\", not a step count (a whole number from 0 to 10^18) (the file "
                 "was edited or damaged)");
  }
  write_bytes(path, good);
  rewrite(path, [](auto& meta, auto&) { meta["seed"] = "18446744073709551616"; });
  CHECK(error_of([&] { rt::read_checkpoint_header(path); }).find("metadata 'seed' is \"18446744073709551616\", not a seed") !=
        std::string::npos);
  write_bytes(path, good);
  rewrite(path, [](auto& meta, auto&) { meta["run"] = "\x1b[31mred"; });
  CHECK(error_of([&] { rt::read_checkpoint_header(path); }) ==
        path + ": metadata 'run' is \"\\x1b[31mred\", not a run id (hex digits) (the file was edited or damaged)");
  write_bytes(path, good);
  rewrite(path, [](auto& meta, auto&) { meta["format"] = "napkin-checkpoint-9"; });
  CHECK(error_of([&] { rt::read_checkpoint_header(path); }) ==
        path + ": checkpoint format 'napkin-checkpoint-9' is not one this trainer reads (napkin-checkpoint-1 or "
               "napkin-checkpoint-2)");
}

TEST_CASE("checkpoint: version 1 files (data-only checksum - no run id) still load") {
  TempDir dir;
  Model saved(1), loaded(0);
  std::vector<rt::TensorData> views;
  for (const auto& t : saved.all()) views.push_back({t.name, t.dtype, t.shape, t.data});
  const std::string path = dir / "step-000003.safetensors";
  rt::write_safetensors_file(path, views, {});
  uint32_t crc;
  {
    rt::SafetensorsFile f(path);
    crc = rt::crc32c(f.data_section(), f.data_size());
  }
  char checksum[32];
  std::snprintf(checksum, sizeof checksum, "crc32c:%08x", crc);
  rt::write_safetensors_file(path, views, {{"format", "napkin-checkpoint-1"}, {"model_hash", "h"}, {"step", "3"},
                                           {"checksum", checksum}});
  rt::CheckpointHeader h = rt::read_checkpoint(path, loaded.all(), "h");
  CHECK(loaded == saved);
  CHECK(h.format == 1);
  CHECK(h.run.empty());
  CHECK(h.step == 3);
  // A run resumed from it may save (and prune) beside it; a fresh run may not.
  CHECK(error_of([&] { rt::CheckpointDir fresh(dir.path, {"h", kRun}); }).find("did not write") != std::string::npos);
  rt::CheckpointDir resumed(dir.path, {"h", kRun, 3, true});
  resumed.save(4, saved.all(), {}, 1);
  CHECK(files_in(dir.path) == std::vector<std::string>{".lock", "step-000004.safetensors"});
}

TEST_CASE("checkpoint: file names - steps and the temporaries of interrupted saves") {
  CHECK(rt::checkpoint_step("step-000100.safetensors") == 100);
  CHECK(!rt::checkpoint_step("step-99999999999999999999.safetensors"));
  CHECK(!rt::checkpoint_step("step--5.safetensors"));
  CHECK(rt::is_checkpoint_temporary(".tmp-step-000100.safetensors-AbC123"));
  CHECK(!rt::is_checkpoint_temporary(".tmp-step-000100.safetensors-AbC12"));
  CHECK(!rt::is_checkpoint_temporary(".tmp-notes.txt-AbC123"));
  CHECK(!rt::is_checkpoint_temporary("step-000100.safetensors"));
}

TEST_CASE("checkpoint dir: a run keeps its newest N and prunes only its own lineage") {
  TempDir dir;
  Model m(1);
  {
    rt::CheckpointDir run(dir.path, {"h", kRun});
    for (int64_t step : {1, 2, 3, 4}) run.save(step, m.all(), {}, 2);
    CHECK(files_in(dir.path) == std::vector<std::string>{".lock", "step-000003.safetensors", "step-000004.safetensors"});
    for (int64_t step : {5, 6}) run.save(step, m.all(), {}, 0);
    CHECK(files_in(dir.path).size() == 5);
  }
  // A resumed run (same model, same run id) may continue here and prune.
  {
    rt::CheckpointDir resumed(dir.path, {"h", kRun, 6});
    resumed.save(7, m.all(), {}, 2);
    CHECK(files_in(dir.path) == std::vector<std::string>{".lock", "step-000006.safetensors", "step-000007.safetensors"});
  }
  // Resumed from step 6 while 7 is there: an abandoned branch; refused, nothing touched.
  CHECK(error_of([&] { rt::CheckpointDir branch(dir.path, {"h", kRun, 6}); })
            .starts_with(dir.path + ": holds 1 checkpoint of this run newer than step 6, the one resumed from "
                                    "(step-000007.safetensors)"));
  const std::string before6 = read_bytes(dir / "step-000006.safetensors");
  // Another run of the same model, another model: refused at start, nothing touched.
  for (auto [hash, run] : {std::pair{"h", "ffffffffffffffff"}, std::pair{"other-model", kRun.c_str()}}) {
    CAPTURE(hash);
    const std::string e = error_of([&] { rt::CheckpointDir other(dir.path, {hash, run}); });
    INFO(e);
    CHECK(e.starts_with(dir.path + ": holds 2 checkpoints that this run did not write (step-000006.safetensors, "
                                   "step-000007.safetensors; written by another "));
    CHECK(e.find("to continue that run: --resume " + dir.path) != std::string::npos);
  }
  CHECK(files_in(dir.path) == std::vector<std::string>{".lock", "step-000006.safetensors", "step-000007.safetensors"});
  CHECK(read_bytes(dir / "step-000006.safetensors") == before6);
}

TEST_CASE("checkpoint dir: a file of another run that appears mid-run is neither pruned nor overwritten") {
  TempDir dir;
  Model m(1), other(2);
  rt::CheckpointDir run(dir.path, {"h", kRun});
  run.save(1, m.all(), {}, 1);
  rt::write_checkpoint(dir.path, 2, other.all(), "h", "ffffffffffffffff", {});
  rt::write_checkpoint(dir.path, 0, other.all(), "h", "ffffffffffffffff", {});
  const std::string theirs = read_bytes(dir / "step-000002.safetensors");
  CHECK(error_of([&] { run.save(2, m.all(), {}, 1); }) ==
        dir / "step-000002.safetensors: will not overwrite it: written by another run of this model (run "
              "ffffffffffffffff); move it away and resume with --resume " + dir.path);
  CHECK(read_bytes(dir / "step-000002.safetensors") == theirs);
  run.save(3, m.all(), {}, 1);  // prunes its own step 1, not their 0 and 2
  CHECK(files_in(dir.path) == std::vector<std::string>{".lock", "step-000000.safetensors", "step-000002.safetensors",
                                                       "step-000003.safetensors"});
}

TEST_CASE("checkpoint dir: start-up locks the dir - checks it is writable - removes stale temporaries") {
  TempDir dir;
  Model m(1);
  write_bytes(dir / ".tmp-step-000002.safetensors-AbC123", "half a checkpoint");
  write_bytes(dir / ".tmp-step-000004.safetensors-xYz789", "");
  write_bytes(dir / "notes.txt", "mine");
  {
    rt::CheckpointDir run(dir.path, {"h", kRun});
    CHECK(run.temporaries_removed() == 2);
    CHECK(files_in(dir.path) == std::vector<std::string>{".lock", "notes.txt"});
    // A second trainer on the same directory stops at once.
    CHECK(error_of([&] { rt::CheckpointDir second(dir.path, {"h", kRun}); })
              .starts_with(dir.path + ": another trainer (pid " + std::to_string(::getpid()) + ") is writing checkpoints here"));
  }
  rt::CheckpointDir after(dir.path, {"h", kRun});  // the lock went with the first
  write_bytes(dir / "file", "");
  CHECK(error_of([&] { rt::CheckpointDir bad(dir / "file/sub", {"h", kRun}); })
            .starts_with(dir / "file/sub: cannot create the checkpoint directory: "));
}

TEST_CASE("checkpoint dir: a directory named like a checkpoint is refused at start-up, named (issue 36 item 14)") {
  TempDir dir;
  fs::create_directory(dir / "step-000100.safetensors");
  const std::string e = error_of([&] { rt::CheckpointDir run(dir.path, {"h", kRun}); });
  CHECK(e.starts_with(dir.path + ": holds 1 entry named like a checkpoint that is not a regular file"));
  CHECK(e.find("\n    " + dir / "step-000100.safetensors") != std::string::npos);
  CHECK(fs::is_directory(dir / "step-000100.safetensors"));  // untouched
}

TEST_CASE("checkpoint dir: .lock is never followed through a symlink - anything but a regular file of yours is refused") {
  TempDir dir;
  const std::string lock = dir / ".lock";
  auto refused = [&](const std::string& why) {
    const std::string e = error_of([&] { rt::CheckpointDir run(dir.path, {"h", kRun}); });
    INFO(e);
    CHECK(e == lock + ": " + why + "; napkin's lock file must be a regular file of yours: remove it or pick another "
                                   "--checkpoint-dir");
  };
  SUBCASE("a link to a file: the file keeps its content") {
    write_bytes(dir / "precious.txt", "mine");
    fs::create_symlink(dir / "precious.txt", lock);
    refused("is a symbolic link");
    CHECK(read_bytes(dir / "precious.txt") == "mine");
  }
  SUBCASE("a dangling link: its target is not created") {
    fs::create_symlink(dir / "nowhere", lock);
    refused("is a symbolic link");
    CHECK(!fs::exists(dir / "nowhere"));
  }
  SUBCASE("a hard link: the other name's file keeps its content") {
    write_bytes(dir / "precious.txt", "mine");
    fs::create_hard_link(dir / "precious.txt", lock);
    refused("has other names (hard links), which the pid written into it would change");
    CHECK(read_bytes(dir / "precious.txt") == "mine");
  }
  SUBCASE("a directory, a FIFO") {
    fs::create_directory(lock);
    refused("is a directory");
    fs::remove(lock);
    REQUIRE(::mkfifo(lock.c_str(), 0644) == 0);
    refused("is not a regular file");
  }
  SUBCASE("another user's file (checked when the test runs as root, who may make one)") {
    write_bytes(lock, "");
    if (::geteuid() == 0) {
      REQUIRE(::chown(lock.c_str(), 65534, 65534) == 0);
      refused("belongs to another user (uid 65534)");
    }
  }
  CHECK(rt::list_checkpoints(dir.path).empty());
}

TEST_CASE("checkpoint: a failed write leaves the previous checkpoint intact and no temp file") {
  TempDir dir;
  Model first(1), second(2);
  const std::string kept = rt::write_checkpoint(dir.path, 100, first.all(), "h", kRun, {});
  const std::string before = read_bytes(kept);

  SUBCASE("the rename fails (a directory is in the way)") {
    fs::create_directories(dir / "step-000200.safetensors/x");
    CHECK(error_of([&] { rt::write_checkpoint(dir.path, 200, second.all(), "h", kRun, {}); })
              .starts_with(dir / "step-000200.safetensors: cannot rename the temporary file into place: "));
    CHECK(files_in(dir.path) == std::vector<std::string>{"step-000100.safetensors", "step-000200.safetensors"});
  }
  SUBCASE("the disk fills up mid-write (RLIMIT_FSIZE)") {
    // Writes past the limit fail with EFBIG instead of raising SIGXFSZ.
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit old_limit;
    getrlimit(RLIMIT_FSIZE, &old_limit);
    rlimit small = old_limit;
    small.rlim_cur = 200;
    setrlimit(RLIMIT_FSIZE, &small);
    const std::string e = error_of([&] { rt::write_checkpoint(dir.path, 200, second.all(), "h", kRun, {}); });
    setrlimit(RLIMIT_FSIZE, &old_limit);
    std::signal(SIGXFSZ, old_handler);
    CHECK(e == dir / "step-000200.safetensors: cannot write: File too large");
    CHECK(files_in(dir.path) == std::vector<std::string>{"step-000100.safetensors"});
  }
  SUBCASE("the directory cannot be created") {
    write_bytes(dir / "file", "");
    CHECK(error_of([&] { rt::write_checkpoint(dir / "file/sub", 200, second.all(), "h", kRun, {}); })
              .starts_with(dir / "file/sub: cannot create the checkpoint directory: "));
  }
  CHECK(read_bytes(kept) == before);
  REQUIRE(!rt::list_checkpoints(dir.path).empty());
  CHECK(rt::list_checkpoints(dir.path).front().second == kept);
  Model loaded(0);
  rt::read_checkpoint(kept, loaded.all(), "h");
  CHECK(loaded == first);
}
