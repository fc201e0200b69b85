// The trainer's data loading: mapped files, .npy parsing (against bytes numpy
// itself writes), and both dataset formats' sampling rules, exactly as
// documented in runtime/dataset.h, plus the error message of every mistake.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/dataset.h"
#include "runtime/error.h"
#include "runtime/float_formats.h"
#include "runtime/mapped_file.h"
#include "runtime/npy.h"
#include "runtime/rng.h"
#include "support/test_io.h"

namespace rt = napkin::runtime;

namespace {

using napkin::testing::error_of;
using napkin::testing::read_bytes;
using napkin::testing::write_bytes;

// A fresh directory for one test case.
struct TempDir : napkin::testing::TempDir {
  TempDir() : napkin::testing::TempDir("data-test") {}
};

template <typename T>
void write_raw(const std::string& path, const std::vector<T>& values) {
  write_bytes(path, std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T)));
}

// numpy 1.24's np.save header for `dict`: magic, version 1.0, u16 length, the
// dict padded with spaces so the data starts at a multiple of 64, '\n'.
std::string numpy_v1_header(const std::string& dict) {
  std::string h = dict;
  h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
  h += '\n';
  return std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(h.size() & 0xff) + static_cast<char>(h.size() >> 8) + h;
}

}  // namespace

// ------------------------------------------------------------------ mapped_file

TEST_CASE("data: MappedFile maps a whole file, and an empty one without mmap") {
  TempDir dir;
  write_bytes(dir / "a.bin", "hello");
  rt::MappedFile f(dir / "a.bin");
  CHECK(f.size() == 5);
  CHECK(std::string(f.data(), f.size()) == "hello");
  CHECK(f.path() == dir / "a.bin");

  rt::MappedFile moved(std::move(f));
  CHECK(std::string(moved.data(), moved.size()) == "hello");
  CHECK(f.data() == nullptr);

  write_bytes(dir / "empty", "");
  rt::MappedFile empty(dir / "empty");
  CHECK(empty.size() == 0);
  CHECK(empty.data() == nullptr);

  CHECK(error_of([&] { rt::MappedFile m(dir / "nope"); }) == dir / "nope: cannot open: No such file or directory");
  CHECK(error_of([&] { rt::MappedFile m(dir.path); }) == dir.path + ": not a regular file (it is a directory)");
  // A FIFO without a writer is refused at once (an open without O_NONBLOCK would wait forever).
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  CHECK(error_of([&] { rt::MappedFile m(dir / "fifo"); }) == dir / "fifo: not a regular file (it is a FIFO (named pipe))");
  CHECK(error_of([&] { rt::MappedFile m("/dev/zero"); }) == "/dev/zero: not a regular file (it is a character device)");
}

TEST_CASE("data: a mapped file truncated under its reader reads zeros and check_intact names it - no SIGBUS") {
  TempDir dir;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  write_bytes(dir / "big.bin", std::string(4 * page, 'x'));
  rt::MappedFile f(dir / "big.bin");
  CHECK(f.data()[3 * page] == 'x');
  f.check_intact();  // nothing happened yet
  ::truncate((dir / "big.bin").c_str(), 100);
  // Pages past the new end are gone: without the guard this load raises SIGBUS.
  volatile const char* p = f.data();
  CHECK(p[3 * page + 5] == 0);
  CHECK(p[2 * page] == 0);
  CHECK(error_of([&] { f.check_intact(); }) ==
        dir / "big.bin: the file shrank while the trainer was reading it (" + std::to_string(4 * page) + " bytes at start, 100 now): it was "
              "truncated or rewritten in place by another program");
  // A truncation inside the last page faults nowhere; the size check still sees it.
  write_bytes(dir / "small.bin", std::string(300, 'y'));
  rt::MappedFile g(dir / "small.bin");
  ::truncate((dir / "small.bin").c_str(), 200);
  CHECK(error_of([&] { g.check_intact(); }).find("(300 bytes at start, 200 now)") != std::string::npos);
}

// ------------------------------------------------------------------ npy

TEST_CASE("npy: write_npy writes the bytes numpy's np.save writes") {
  TempDir dir;
  const float v[6] = {1, 2, 3, 4, 5, 6};
  rt::write_npy(dir / "a.npy", "<f4", {2, 3}, v, sizeof v);
  // np.save(f, np.array([[1,2,3],[4,5,6]], dtype='<f4')) with numpy 1.24: 152 bytes.
  const std::string want = numpy_v1_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }") +
                           std::string(reinterpret_cast<const char*>(v), sizeof v);
  CHECK(want.size() == 152);
  CHECK(want.substr(8, 2) == std::string("v\x00", 2));  // numpy's header length, 118
  CHECK(read_bytes(dir / "a.npy") == want);

  rt::NpyArray a = rt::read_npy(dir / "a.npy");
  CHECK(a.descr == "<f4");
  CHECK(a.dtype == rt::DType::F32);
  CHECK(a.itemsize == 4);
  CHECK(a.shape == std::vector<int64_t>{2, 3});
  CHECK(a.numel == 6);
  CHECK(std::memcmp(a.data, v, sizeof v) == 0);
  CHECK(reinterpret_cast<uintptr_t>(a.data) % 64 == 0);
}

TEST_CASE("npy: every supported dtype, scalars, 1-d and empty arrays read back") {
  TempDir dir;
  struct Case {
    const char* descr;
    rt::DType dtype;
    size_t itemsize;
  };
  using T = rt::DType;
  for (Case c : {Case{"<f4", T::F32, 4}, Case{"<f8", T::F64, 8}, Case{"<f2", T::F16, 2}, Case{"<i4", T::I32, 4},
                 Case{"<i8", T::I64, 8}, Case{"<u2", T::U16, 2}, Case{"|u1", T::U8, 1}, Case{"|b1", T::Bool, 1}}) {
    CAPTURE(c.descr);
    std::vector<char> data(5 * c.itemsize);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i % 2);
    rt::write_npy(dir / "x.npy", c.descr, {5}, data.data(), data.size());
    rt::NpyArray a = rt::read_npy(dir / "x.npy");
    CHECK(a.dtype == c.dtype);
    CHECK(a.shape == std::vector<int64_t>{5});
    CHECK(std::memcmp(a.data, data.data(), data.size()) == 0);
  }
  const double s = 3.5;
  rt::write_npy(dir / "s.npy", "<f8", {}, &s, 8);
  CHECK(read_bytes(dir / "s.npy").substr(10, 57) == "{'descr': '<f8', 'fortran_order': False, 'shape': (), }  ");
  rt::NpyArray scalar = rt::read_npy(dir / "s.npy");
  CHECK(scalar.shape.empty());
  CHECK(scalar.numel == 1);
  rt::write_npy(dir / "e.npy", "<f4", {0, 7}, nullptr, 0);
  CHECK(rt::read_npy(dir / "e.npy").numel == 0);
}

TEST_CASE("npy: versions 2.0 and 3.0 (four-byte header length) and hand-written headers") {
  TempDir dir;
  // np.lib.format.write_array(f, np.array([7, 8], dtype='<u2'), version=(2, 0)), 132 bytes.
  std::string dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }";
  dict.append(116 - dict.size() - 1, ' ');
  dict += '\n';
  const std::string v2 = std::string("\x93NUMPY\x02\x00t\x00\x00\x00", 12) + dict + std::string("\x07\x00\x08\x00", 4);
  CHECK(v2.size() == 132);
  write_bytes(dir / "v2.npy", v2);
  rt::NpyArray a = rt::read_npy(dir / "v2.npy");
  CHECK(a.shape == std::vector<int64_t>{2});
  CHECK(reinterpret_cast<const uint16_t*>(a.data)[1] == 8);

  std::string v3 = v2;
  v3[6] = 3;
  write_bytes(dir / "v3.npy", v3);
  CHECK(rt::read_npy(dir / "v3.npy").dtype == rt::DType::U16);

  // Double quotes, no spaces, no trailing commas, keys in another order.
  write_bytes(dir / "h.npy", numpy_v1_header("{\"shape\":(2),\"fortran_order\":False,\"descr\":\"|u1\"}") + "ab");
  CHECK(rt::read_npy(dir / "h.npy").shape == std::vector<int64_t>{2});
}

TEST_CASE("npy: every malformed or unsupported file is a precise error") {
  TempDir dir;
  const std::string p = dir / "x.npy";
  auto err = [&](const std::string& bytes) {
    write_bytes(p, bytes);
    return error_of([&] { rt::read_npy(p); });
  };
  const std::string f4 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

  CHECK(err("PK\x03\x04 a zip file, really") == p + ": not a .npy file (no \\x93NUMPY magic at the start)");
  CHECK(err(std::string("\x93NUMPY\x04\x00\x00\x00", 10)) == p + ": .npy version 4.0 is not supported (only 1.0, 2.0 and 3.0)");
  CHECK(err(std::string("\x93NUMPY\x01\x00\xff\x00{}", 12)) ==
        p + ": truncated .npy header: it claims 255 bytes, the file has 2 after the length field");
  CHECK(err(numpy_v1_header("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }") + std::string(24, 0)) ==
        p + ": big-endian data (>f4) is not supported; save it little-endian, e.g. arr.astype('<f4')");
  CHECK(err(numpy_v1_header("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }") + std::string(16, 0)) ==
        p + ": dtype <c8 is not supported (supported: <f4 <f8 <f2 <i4 <i8 <u2 |u1 |b1)");
  CHECK(err(numpy_v1_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }") + std::string(24, 0)) ==
        p + ": Fortran-order (column-major) arrays are not supported; save np.ascontiguousarray(arr)");
  CHECK(err(numpy_v1_header(f4) + std::string(20, 0)) ==
        p + ": truncated: expected 24 bytes of data (shape (2, 3) of <f4), found 20");
  CHECK(err(numpy_v1_header(f4) + std::string(25, 0)) ==
        p + ": 1 bytes after the data: expected 24 bytes of data (shape (2, 3) of <f4), found 25");
  CHECK(err(numpy_v1_header("{'descr': '<f4', 'fortran_order': False}")) ==
        p + ": malformed .npy header: no 'shape' in {'descr': '<f4', 'fortran_order': False}");
  CHECK(err(numpy_v1_header("{'descr': '<f4', 'fortran_order': Nope, 'shape': (2,)}")).starts_with(
        p + ": malformed .npy header: expected True or False in {'descr'"));
  CHECK(err(numpy_v1_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}"))
            .starts_with(p + ": malformed .npy header: expected a dimension (a non-negative integer)"));
  CHECK(err(numpy_v1_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}"))
            .starts_with(p + ": malformed .npy header: unexpected key 'x'"));
  CHECK(error_of([&] { rt::write_npy(p, "<f4", {2}, nullptr, 4); }) == p + ": shape (2,) of <f4 needs 8 bytes, given 4");
}

// ------------------------------------------------------------------ tokens

namespace {

// A u16 token file whose token at position i is i mod 65536 (so a window's
// contents say where it starts), and the inputs of a [batch, seq] LM.
struct TokenFixture {
  TempDir dir;
  std::string path = dir / "tiny.u16";
  int64_t batch, seq;
  std::vector<int32_t> x, y;
  rt::DataSpec spec;

  TokenFixture(int64_t n, int64_t batch_, int64_t seq_, double split, std::string order)
      : batch(batch_), seq(seq_), x(static_cast<size_t>(batch_ * seq_)), y(x.size()) {
    std::vector<uint16_t> tokens(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<uint16_t>(i);
    write_raw(path, tokens);
    spec.format = rt::DataFormat::Tokens;
    spec.path = path;
    spec.token_dtype = rt::DType::U16;
    spec.order = rt::parse_data_order(path, order);
    spec.split = split;
    spec.seed = 1234;
  }
  std::vector<rt::InputSlot> slots() {
    return {{"tokens", rt::DType::I32, {batch, seq}, reinterpret_cast<char*>(x.data())},
            {"targets", rt::DType::I32, {batch, seq}, reinterpret_cast<char*>(y.data())}};
  }
  std::unique_ptr<rt::Dataset> open() { return rt::Dataset::open(spec, slots()); }
  // The start of row r, checking that the row is a window and the targets are shifted by one.
  int64_t start(int64_t r) const {
    const int64_t s = x[static_cast<size_t>(r * seq)];
    for (int64_t i = 0; i < seq; ++i) {
      REQUIRE(x[static_cast<size_t>(r * seq + i)] == s + i);
      REQUIRE(y[static_cast<size_t>(r * seq + i)] == s + i + 1);
    }
    return s;
  }
};

}  // namespace

TEST_CASE("data: sequential token windows tile the train part: start (p mod W) * seq, p = step * batch + row") {
  TokenFixture f(1000, 4, 8, 0.9, "sequential");
  auto data = f.open();
  // n_train = 900, W = (900 - 1) / 8 = 112 windows; eval: 100 tokens, (100 - 1) / 8 = 12 windows.
  CHECK(data->train_examples() == 112);
  CHECK(data->eval_examples() == 12);
  CHECK(data->has_eval());
  CHECK(data->describe() == f.path + ": 1,000 u16 tokens (900 train / 100 eval), sequential windows of 9");
  for (int64_t step : {0, 1, 27, 28, 29, 1000}) {
    data->fill_train(step);
    for (int64_t r = 0; r < 4; ++r) CHECK(f.start(r) == ((step * 4 + r) % 112) * 8);
  }
  // The last window, 111, reads up to token 111 * 8 + 8 = 896 < 900.
  data->fill_train(27);
  CHECK(f.start(3) == 888);
}

TEST_CASE("data: eval batches are sequential over the held-out tokens and restart at each evaluation") {
  TokenFixture f(1000, 4, 8, 0.9, "random");
  auto data = f.open();
  for (int64_t index : {0, 1, 2, 3}) {
    data->fill_eval(index);
    for (int64_t r = 0; r < 4; ++r) CHECK(f.start(r) == 900 + ((index * 4 + r) % 12) * 8);
  }
  data->fill_train(5);  // training in between changes nothing
  data->fill_eval(0);
  CHECK(f.start(0) == 900);
}

TEST_CASE("data: random token windows are uniform in [0, n_train - seq - 1], from Rng(seed, data.train + step)") {
  TokenFixture f(1000, 4, 8, 0.9, "random");
  auto data = f.open();
  CHECK(data->describe() == f.path + ": 1,000 u16 tokens (900 train / 100 eval), random windows of 9");
  for (int64_t step : {0, 7}) {
    data->fill_train(step);
    rt::Rng rng(1234, rt::stream_for_name("data.train") + static_cast<uint64_t>(step));
    for (int64_t r = 0; r < 4; ++r) {
      uint64_t a = rng.next_u32(), b = rng.next_u32();
      auto want = static_cast<int64_t>((static_cast<unsigned __int128>((a << 32) | b) * 892) >> 64);
      CHECK(f.start(r) == want);
    }
  }
  // A pure function of (seed, step): the order of calls does not matter.
  data->fill_train(3);
  const std::vector<int32_t> first = f.x;
  data->fill_train(4);
  CHECK(f.x != first);
  data->fill_train(3);
  CHECK(f.x == first);
  // Another seed, other windows.
  f.spec.seed = 1235;
  f.open()->fill_train(3);
  CHECK(f.x != first);
}

TEST_CASE("data: random windows reach both ends of the train part, inclusive") {
  // n_train = seq + 2 = 10: exactly two windows, starting at 0 and 1.
  TokenFixture f(10, 2, 8, 1.0, "random");
  auto data = f.open();
  std::set<int64_t> starts;
  for (int64_t step = 0; step < 64; ++step) {
    data->fill_train(step);
    starts.insert(f.start(0));
    starts.insert(f.start(1));
  }
  CHECK(starts == std::set<int64_t>{0, 1});
}

TEST_CASE("data: i32 token files, and token ids checked against the vocabulary") {
  TempDir dir;
  const std::string path = dir / "t.i32";
  write_raw<int32_t>(path, {5, 6, 7, 8, 9, -1, 100});
  std::vector<int32_t> x(2), y(2);
  rt::DataSpec spec;
  spec.format = rt::DataFormat::Tokens;
  spec.path = path;
  spec.token_dtype = rt::DType::I32;
  spec.order = rt::DataOrder::Sequential;
  spec.vocab_bound = 10;
  auto slots = [&] {
    return std::vector<rt::InputSlot>{{"x", rt::DType::I32, {1, 2}, reinterpret_cast<char*>(x.data())},
                                      {"y", rt::DType::I32, {1, 2}, reinterpret_cast<char*>(y.data())}};
  };
  auto data = rt::Dataset::open(spec, slots());
  data->fill_train(0);
  CHECK(x == std::vector<int32_t>{5, 6});
  CHECK(y == std::vector<int32_t>{6, 7});
  data->fill_train(1);
  CHECK(x == std::vector<int32_t>{7, 8});
  CHECK(error_of([&] { data->fill_train(2); }) == path + ": token -1 at position 5 is negative");
  spec.split = 6.0 / 7.0 + 1e-9;  // n_train = 6: windows at 0, 2
  spec.token_dtype = rt::DType::I32;
  write_raw<int32_t>(path, {5, 6, 7, 8, 10, 9, 1});
  data = rt::Dataset::open(spec, slots());
  CHECK(error_of([&] { data->fill_train(1); }) == path + ": token 10 at position 4 is not below the vocabulary size 10");
}

TEST_CASE("data: u32 token files hold ids past 65,535 (a large vocabulary's, napkin data encode --dtype u32)") {
  TempDir dir;
  const std::string path = dir / "t.u32";
  write_raw<uint32_t>(path, {70000, 70001, 5, 131071, 9});
  std::vector<int32_t> x(2), y(2);
  rt::DataSpec spec;
  spec.format = rt::DataFormat::Tokens;
  spec.path = path;
  spec.token_dtype = rt::parse_token_dtype(path, "u32");
  spec.order = rt::DataOrder::Sequential;
  auto slots = [&] {
    return std::vector<rt::InputSlot>{{"x", rt::DType::I32, {1, 2}, reinterpret_cast<char*>(x.data())},
                                      {"y", rt::DType::I32, {1, 2}, reinterpret_cast<char*>(y.data())}};
  };
  auto data = rt::Dataset::open(spec, slots());
  CHECK(data->describe() == path + ": 5 u32 tokens (5 train / 0 eval), sequential windows of 3");
  data->fill_train(0);
  CHECK(x == std::vector<int32_t>{70000, 70001});
  CHECK(y == std::vector<int32_t>{70001, 5});
  data->fill_train(1);
  CHECK(x == std::vector<int32_t>{5, 131071});
  CHECK(y == std::vector<int32_t>{131071, 9});
  spec.vocab_bound = 100000;
  data = rt::Dataset::open(spec, slots());
  CHECK(error_of([&] { data->fill_train(1); }) == path + ": token 131071 at position 3 is not below the vocabulary size 100000");
  write_bytes(path, std::string(6, 'a'));
  CHECK(error_of([&] { rt::Dataset::open(spec, slots()); }) == path + ": 6 bytes is not a whole number of u32 tokens");
}

namespace {

// llm.c's .bin as its dev/data/data_common.py write_datafile writes it: 256
// int32s (magic, version, token count, zeros), then the tokens.
template <typename T>
void write_llmc(const std::string& path, int32_t magic, int32_t version, int32_t count, const std::vector<T>& tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic, header[1] = version, header[2] = count;
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(T));
  write_bytes(path, bytes);
}

}  // namespace

TEST_CASE("data: llm.c's .bin token files (GPT-2 u16 and Llama 3 u32) read as the same tokens raw") {
  TokenFixture raw(1000, 4, 8, 0.9, "random");
  auto want = raw.open();
  std::vector<uint16_t> tokens(1000);
  for (int i = 0; i < 1000; ++i) tokens[size_t(i)] = uint16_t(i);
  TokenFixture llmc(1000, 4, 8, 0.9, "random");
  write_llmc<uint16_t>(llmc.path, 20240520, 1, 1000, tokens);
  auto got = llmc.open();
  CHECK(got->describe() == llmc.path + ": 1,000 llm.c .bin (GPT-2, u16 tokens) tokens (900 train / 100 eval), random windows of 9");
  for (int64_t step : {0, 3, 17}) {
    want->fill_train(step);
    got->fill_train(step);
    CHECK(llmc.x == raw.x);
    CHECK(llmc.y == raw.y);
  }
  got->fill_eval(1);
  want->fill_eval(1);
  CHECK(llmc.x == raw.x);
  // Llama 3's: u32 tokens, whatever dtype the model's data spec names.
  std::vector<uint32_t> wide(tokens.begin(), tokens.end());
  write_llmc<uint32_t>(llmc.path, 20240801, 7, 1000, wide);
  got = llmc.open();
  got->fill_train(17);
  want->fill_train(17);
  CHECK(llmc.x == raw.x);
}

TEST_CASE("data: a broken llm.c header is an error saying what is wrong") {
  TokenFixture f(100, 2, 8, 0.9, "random");
  const std::vector<uint16_t> tokens(100, 3);
  write_llmc<uint16_t>(f.path, 20240520, 2, 100, tokens);
  CHECK(error_of([&] { f.open(); }) == f.path + ": llm.c .bin (GPT-2, u16 tokens) header has version 2, expected 1");
  write_llmc<uint16_t>(f.path, 20240520, 1, 120, tokens);
  CHECK(error_of([&] { f.open(); }) ==
        f.path + ": llm.c .bin (GPT-2, u16 tokens) header says 120 tokens, but the file holds 200 bytes after the "
                 "header (100 tokens): truncated or not written by llm.c");
  write_bytes(f.path, std::string("\x88\xd8\x34\x01", 4) + std::string(100, '\0'));
  CHECK(error_of([&] { f.open(); }) == f.path + ": starts with llm.c .bin (GPT-2, u16 tokens)'s magic 20240520 but is "
                                               "104 bytes, shorter than its 1,024-byte header");
}

TEST_CASE("data: token file mistakes name the file and what is wrong") {
  TokenFixture f(100, 2, 8, 0.9, "random");
  write_bytes(f.path, std::string(17, 'a'));
  CHECK(error_of([&] { f.open(); }) == f.path + ": 17 bytes is not a whole number of u16 tokens");

  write_raw<uint16_t>(f.path, std::vector<uint16_t>(8));
  CHECK(error_of([&] { f.open(); }) ==
        f.path + ": too few tokens: the train part has 7 of 8 tokens, but one window needs seq + 1 = 9");

  write_raw<uint16_t>(f.path, std::vector<uint16_t>(100, 70));
  f.spec.vocab_bound = 65;
  CHECK(error_of([&] { f.open()->fill_train(0); }).ends_with(" is not below the vocabulary size 65"));
  f.spec.vocab_bound = 0;

  // Held out: 10 tokens, one window needs 9: fine. With split 0.95, 5: no eval.
  CHECK(f.open()->has_eval());
  f.spec.split = 0.95;
  auto data = f.open();
  CHECK(!data->has_eval());
  CHECK(error_of([&] { data->fill_eval(0); }) ==
        f.path + ": no eval data: split 0.95 holds out 5 tokens, but one eval window needs seq + 1 = 9 (lower the split)");
  f.spec.split = 1.0;
  CHECK(!f.open()->has_eval());
  CHECK_THROWS_AS(f.open()->fill_train(-1), std::invalid_argument);

  f.spec.split = 0.0;
  CHECK(error_of([&] { f.open(); }) == f.path + ": split 0 is not in (0, 1]");
  f.spec.split = 0.9;
  // The text of train.data and --order is parsed before the data opens.
  CHECK(error_of([&] { rt::parse_data_order(f.path, "shuffled"); }) ==
        f.path + ": order 'shuffled' is neither 'random' nor 'sequential'");
  CHECK(error_of([&] { rt::parse_token_dtype(f.path, "u8"); }) == f.path + ": token dtype 'u8' is none of u16, u32, i32");
  CHECK(error_of([&] { rt::parse_data_format("csv"); }) == "data format 'csv' is neither 'tokens' nor 'npy'");

  // The model's inputs must be two i32 [batch, seq].
  std::vector<float> fx(16);
  auto slots = f.slots();
  slots[1].dtype = rt::DType::F32;
  slots[1].dest = reinterpret_cast<char*>(fx.data());
  CHECK(error_of([&] { rt::Dataset::open(f.spec, slots); }) ==
        f.path + ": a token file feeds exactly two i32 inputs of the same shape [batch, seq] (the tokens, then the "
                 "next-token targets); this model's inputs are tokens i32[2, 8], targets f32[2, 8]");
  slots.pop_back();
  CHECK(error_of([&] { rt::Dataset::open(f.spec, slots); }).ends_with("this model's inputs are tokens i32[2, 8]"));
  f.spec.path = f.dir / "missing.u16";
  CHECK(error_of([&] { f.open(); }) == f.dir / "missing.u16: cannot open: No such file or directory");
}

// ------------------------------------------------------------------ npy datasets

namespace {

// x: f32 [N, 3] with x[i] = {i, i + 0.25, i + 0.5}; y: i64 [N] with y[i] = 100 + i,
// feeding an i32 input (a checked conversion). Batch 5.
struct NpyFixture {
  TempDir dir;
  int64_t n;
  std::vector<float> x = std::vector<float>(15);
  std::vector<int32_t> y = std::vector<int32_t>(5);
  rt::DataSpec spec;

  NpyFixture(int64_t n_, double split, std::string order) : n(n_) {
    std::vector<float> xs;
    std::vector<int64_t> ys;
    for (int64_t i = 0; i < n; ++i) {
      xs.insert(xs.end(), {float(i), float(i) + 0.25f, float(i) + 0.5f});
      ys.push_back(100 + i);
    }
    rt::write_npy(dir / "x.npy", "<f4", {n, 3}, xs.data(), xs.size() * 4);
    rt::write_npy(dir / "y.npy", "<i8", {n}, ys.data(), ys.size() * 8);
    spec.format = rt::DataFormat::Npy;
    spec.files = {{"x", dir / "x.npy"}, {"y", dir / "y.npy"}};
    spec.order = rt::parse_data_order("npy data", order);
    spec.split = split;
    spec.seed = 99;
  }
  std::vector<rt::InputSlot> slots() {
    return {{"x", rt::DType::F32, {5, 3}, reinterpret_cast<char*>(x.data())}, {"y", rt::DType::I32, {5}, reinterpret_cast<char*>(y.data())}};
  }
  std::unique_ptr<rt::Dataset> open() { return rt::Dataset::open(spec, slots()); }
  // The rows of the batch, checking that x and y agree.
  std::vector<int64_t> rows() const {
    std::vector<int64_t> out;
    for (size_t r = 0; r < 5; ++r) {
      const int64_t i = y[r] - 100;
      REQUIRE(x[3 * r] == float(i));
      REQUIRE(x[3 * r + 2] == float(i) + 0.5f);
      out.push_back(i);
    }
    return out;
  }
};

}  // namespace

TEST_CASE("data: npy sequential rows are (step * batch + row) mod n_train - eval reads the held-out rows") {
  NpyFixture f(12, 0.75, "sequential");  // 9 train rows, 3 eval rows
  auto data = f.open();
  CHECK(data->train_examples() == 9);
  CHECK(data->eval_examples() == 3);
  CHECK(data->describe() == f.dir / "x.npy, " + f.dir / "y.npy: 12 rows (9 train / 3 eval), sequential order");
  data->fill_train(0);
  CHECK(f.rows() == std::vector<int64_t>{0, 1, 2, 3, 4});
  data->fill_train(1);
  CHECK(f.rows() == std::vector<int64_t>{5, 6, 7, 8, 0});
  data->fill_train(4);
  CHECK(f.rows() == std::vector<int64_t>{2, 3, 4, 5, 6});
  data->fill_eval(0);
  CHECK(f.rows() == std::vector<int64_t>{9, 10, 11, 9, 10});
  data->fill_eval(1);
  CHECK(f.rows() == std::vector<int64_t>{11, 9, 10, 11, 9});
}

TEST_CASE("data: npy with split 1 evaluates on the train rows") {
  NpyFixture f(7, 1.0, "sequential");
  auto data = f.open();
  CHECK(data->eval_examples() == 7);
  CHECK(data->describe().ends_with(": 7 rows (all train, eval on the train rows), sequential order"));
  data->fill_eval(1);
  CHECK(f.rows() == std::vector<int64_t>{5, 6, 0, 1, 2});
}

TEST_CASE("data: npy random order is a Fisher-Yates permutation per epoch from Rng(seed, data.epoch + epoch)") {
  NpyFixture f(10, 1.0, "random");
  auto data = f.open();
  CHECK(data->describe().ends_with("random order, reshuffled each epoch"));
  auto batch = [&](int64_t step) {
    data->fill_train(step);
    return f.rows();
  };
  // The documented shuffle, recomputed here.
  auto perm = [&](int64_t epoch) {
    std::vector<int64_t> p(10);
    for (int64_t i = 0; i < 10; ++i) p[i] = i;
    rt::Rng rng(99, rt::stream_for_name("data.epoch") + static_cast<uint64_t>(epoch));
    for (int64_t i = 9; i >= 1; --i) {
      uint64_t a = rng.next_u32(), b = rng.next_u32();
      auto j = static_cast<size_t>((static_cast<unsigned __int128>((a << 32) | b) * static_cast<uint64_t>(i + 1)) >> 64);
      std::swap(p[i], p[j]);
    }
    return p;
  };
  // Steps 0 and 1 are epoch 0, steps 2 and 3 epoch 1: each epoch sees every row once.
  std::vector<int64_t> epoch0 = batch(0), epoch1 = batch(2);
  for (int64_t r : batch(1)) epoch0.push_back(r);
  for (int64_t r : batch(3)) epoch1.push_back(r);
  CHECK(epoch0 == perm(0));
  CHECK(epoch1 == perm(1));
  CHECK(epoch0 != epoch1);
  CHECK(std::set<int64_t>(epoch0.begin(), epoch0.end()).size() == 10);
  // Pure in (seed, step): revisiting an earlier epoch gives the same rows.
  const std::vector<int64_t> p0 = perm(0);
  CHECK(batch(0) == std::vector<int64_t>(p0.begin(), p0.begin() + 5));

  // A batch can straddle two epochs: 7 train rows, step 1 = examples 5..9.
  NpyFixture g(7, 1.0, "random");
  auto d7 = g.open();
  d7->fill_train(1);
  std::vector<int64_t> rows = g.rows();
  d7->fill_train(0);
  std::vector<int64_t> first = g.rows();
  std::set<int64_t> seen(first.begin(), first.end());
  seen.insert(rows[0]);
  seen.insert(rows[1]);
  CHECK(seen.size() == 7);  // examples 0..6 are epoch 0, a permutation of all 7 rows
}

TEST_CASE("data: npy integer inputs take any integer file with a range check - bf16 takes f32") {
  TempDir dir;
  const std::vector<uint16_t> u16 = {0, 65535};
  rt::write_npy(dir / "u.npy", "<u2", {2}, u16.data(), 4);
  std::vector<int32_t> out(2);
  rt::DataSpec spec;
  spec.format = rt::DataFormat::Npy;
  spec.order = rt::DataOrder::Sequential;
  spec.files = {{"ids", dir / "u.npy"}};
  rt::Dataset::open(spec, {{"ids", rt::DType::I32, {2}, reinterpret_cast<char*>(out.data())}})->fill_train(0);
  CHECK(out == std::vector<int32_t>{0, 65535});

  const std::vector<int64_t> big = {1, int64_t(1) << 40};
  rt::write_npy(dir / "big.npy", "<i8", {2}, big.data(), 16);
  spec.files = {{"ids", dir / "big.npy"}};
  auto data = rt::Dataset::open(spec, {{"ids", rt::DType::I32, {2}, reinterpret_cast<char*>(out.data())}});
  CHECK(error_of([&] { data->fill_train(0); }) ==
        dir / "big.npy: row 1 holds 1099511627776, which does not fit in i32 input 'ids'");
  std::vector<int64_t> wide(2);
  rt::Dataset::open(spec, {{"ids", rt::DType::I64, {2}, reinterpret_cast<char*>(wide.data())}})->fill_train(0);
  CHECK(wide == big);

  const std::vector<float> f = {1.0f, 1.00390625f, 3.0f, -0.0f};  // 1 + 2^-8 is a bf16 tie: rounds to even, 1.0
  rt::write_npy(dir / "f.npy", "<f4", {2, 2}, f.data(), 16);
  std::vector<uint16_t> bf(4);
  spec.files = {{"h", dir / "f.npy"}};
  rt::Dataset::open(spec, {{"h", rt::DType::BF16, {2, 2}, reinterpret_cast<char*>(bf.data())}})->fill_train(0);
  CHECK(bf == std::vector<uint16_t>{0x3F80, 0x3F80, 0x4040, 0x8000});
}

TEST_CASE("data: npy mistakes name the file and what is wrong") {
  NpyFixture f(12, 0.75, "random");
  auto slots = f.slots();
  rt::write_npy(f.dir / "x8.npy", "<f8", {12, 3}, std::vector<double>(36).data(), 288);
  f.spec.files["x"] = f.dir / "x8.npy";
  CHECK(error_of([&] { f.open(); }) == f.dir / "x8.npy: dtype <f8 but input 'x' is f32");

  rt::write_npy(f.dir / "x4.npy", "<f4", {12, 4}, std::vector<float>(48).data(), 192);
  f.spec.files["x"] = f.dir / "x4.npy";
  CHECK(error_of([&] { f.open(); }) ==
        f.dir / "x4.npy: shape (12, 4) does not fit input 'x' f32[5, 3]: expected (N, 3), one row per example");

  rt::write_npy(f.dir / "x11.npy", "<f4", {11, 3}, std::vector<float>(33).data(), 132);
  f.spec.files["x"] = f.dir / "x11.npy";
  CHECK(error_of([&] { f.open(); }) == f.dir / "y.npy has 12 rows but " + f.dir / "x11.npy has 11");

  f.spec.files["x"] = f.dir / "x.npy";
  f.spec.files["z"] = f.dir / "x.npy";
  CHECK(error_of([&] { f.open(); }) ==
        f.dir / "x.npy: given for input 'z', which this model does not have (its inputs: x, y)");
  f.spec.files.erase("z");
  f.spec.files.erase("y");
  CHECK(error_of([&] { f.open(); }) == "no .npy file given for input 'y' i32[5]");

  NpyFixture g(12, 1.0, "random");
  std::vector<int32_t> bools(5);
  CHECK(error_of([&] {
          rt::Dataset::open(g.spec, {g.slots()[0], {"y", rt::DType::Bool, {5}, reinterpret_cast<char*>(bools.data())}});
        }) == g.dir / "y.npy: dtype <i8 but input 'y' is bool");
  g.spec.split = 0.05;
  CHECK(error_of([&] { g.open(); }) == g.dir / "x.npy: split 0.05 of 12 rows leaves no training rows");
}

TEST_CASE("data: with_commas groups thousands") {
  CHECK(rt::with_commas(0) == "0");
  CHECK(rt::with_commas(999) == "999");
  CHECK(rt::with_commas(1000) == "1,000");
  CHECK(rt::with_commas(1234567) == "1,234,567");
  CHECK(rt::with_commas(-1234) == "-1,234");
}
