// NVRTC and its kernel cache (codegen/cuda/nvrtc_compile.h, kernel_cache.h),
// on hand-written CUDA C independent of napkin's kernel emitter: the cubin
// is a CUDA ELF image, the PTX names the target and every kernel, a repeat
// compile is a cache hit with the same bytes, anything in the key changing
// is a miss, a damaged cache entry is rebuilt, and the user's and napkin's
// mistakes give the messages they should. Needs NVRTC, not a GPU.
#ifdef NAPKIN_HAVE_CUDA

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "codegen/cuda/kernel_cache.h"
#include "codegen/cuda/nvrtc_compile.h"
#include "codegen/cuda/sha256.h"
#include "codegen/host/private_cache.h"
#include "ir/internal_check.h"
#include "support/test_io.h"

namespace fs = std::filesystem;
using namespace napkin::codegen::cuda;
using napkin::testing::read_bytes;
using napkin::testing::TempDir;
using napkin::testing::write_bytes;

namespace {

// Two kernels with a block reduction, big enough that NVRTC takes a while.
const std::string kSource = R"(
extern "C" __global__ void scale(float* __restrict__ x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * a + 1.0f;
}
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
extern "C" __global__ void row_sums(const float* __restrict__ x, float* __restrict__ out, int cols) {
  __shared__ float partial[32];
  float s = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(x[blockIdx.x * cols + c]);
  s = warp_sum(s);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    s = warp_sum(s);
    if (threadIdx.x == 0) out[blockIdx.x] = logf(s);
  }
}
)";

NvrtcOptions in(const TempDir& dir, const std::string& arch = "sm_90") {
  NvrtcOptions o;
  o.arch = arch;
  o.cache_dir = dir.path;
  return o;
}

std::vector<fs::path> entries(const TempDir& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir.path)) files.push_back(e.path());
  return files;
}

// Sets (or, with nullopt, unsets) an environment variable for the scope of a
// test, restoring what it was.
class EnvVar {
 public:
  EnvVar(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* v = std::getenv(name)) saved_ = v;
    set(value);
  }
  ~EnvVar() { set(saved_); }
  void set(const std::optional<std::string>& value) {
    if (value) setenv(name_, value->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

uint16_t elf_machine(const std::string& elf) {
  uint16_t machine = 0;
  std::memcpy(&machine, elf.data() + 18, 2);  // e_machine, little-endian like the host
  return machine;
}

}  // namespace

TEST_CASE("sha256: the FIPS 180-4 test vectors") {
  auto digest = [](const std::string& s) {
    Sha256 h;
    h.update(s);
    return hex(h.finish());
  };
  CHECK(digest("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(digest("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(digest("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // A million 'a's, fed in uneven pieces (the buffering across blocks).
  Sha256 h;
  std::string piece(997, 'a');
  for (int fed = 0; fed < 1000000; fed += 997) h.update(std::string_view(piece).substr(0, std::min(997, 1000000 - fed)));
  CHECK(hex(h.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("nvrtc: a cubin for sm_90 and PTX naming the target and every kernel") {
  TempDir dir("nvrtc");
  NvrtcResult r = nvrtc_compile(kSource, "two_kernels.cu", in(dir));
  REQUIRE(r.cubin.size() > 64);
  CHECK(r.cubin.substr(0, 4) == "\x7f" "ELF");
  CHECK(elf_machine(r.cubin) == 190);  // EM_CUDA
  CHECK(r.ptx.find(".target sm_90") != std::string::npos);
  CHECK(r.ptx.find(".entry scale(") != std::string::npos);
  CHECK(r.ptx.find(".entry row_sums(") != std::string::npos);
  CHECK(r.ptx.find('\0') == std::string::npos);
  CHECK(r.arch == "sm_90");
  CHECK(!r.nvrtc_version.empty());
  CHECK(!r.cache_hit);
  // --fmad=false: the multiply and the add of scale() stay two roundings, as
  // on the CPU (expf and logf of row_sums use fmaf on purpose: only scale()).
  std::string scale = r.ptx.substr(r.ptx.find(".entry scale("), r.ptx.find(".entry row_sums(") - r.ptx.find(".entry scale("));
  CHECK(scale.find("fma.rn.f32") == std::string::npos);
  CHECK(scale.find("mul.rn.f32") != std::string::npos);
  CHECK(scale.find("add.rn.f32") != std::string::npos);
}

TEST_CASE("nvrtc: architecture-specific and other targets") {
  TempDir dir("nvrtc");
  NvrtcResult a = nvrtc_compile(kSource, "k.cu", in(dir, "sm_90a"));
  CHECK(a.ptx.find(".target sm_90a") != std::string::npos);
  NvrtcResult b = nvrtc_compile(kSource, "k.cu", in(dir, "sm_80"));
  CHECK(b.ptx.find(".target sm_80") != std::string::npos);
  CHECK(elf_machine(b.cubin) == 190);
  CHECK(a.cubin != b.cubin);
}

TEST_CASE("nvrtc: a repeat compile is a cache hit with the same bytes, ten times faster") {
  TempDir dir("nvrtc");
  NvrtcResult first = nvrtc_compile(kSource, "k.cu", in(dir));
  REQUIRE(!first.cache_hit);
  REQUIRE(entries(dir).size() == 1);
  NvrtcResult second = nvrtc_compile(kSource, "k.cu", in(dir));
  CHECK(second.cache_hit);
  CHECK(second.cubin == first.cubin);
  CHECK(second.ptx == first.ptx);
  CHECK(second.seconds < first.seconds / 10);
  MESSAGE("compile " << first.seconds * 1e3 << " ms, cache hit " << second.seconds * 1e3 << " ms");

  SUBCASE("without the cache NVRTC runs again and gives the same bytes") {
    NvrtcOptions o = in(dir);
    o.use_cache = false;
    NvrtcResult third = nvrtc_compile(kSource, "k.cu", o);
    CHECK(!third.cache_hit);
    CHECK(third.cubin == first.cubin);
  }
  SUBCASE("a different arch, option, name or source is a miss") {
    CHECK(!nvrtc_compile(kSource, "k.cu", in(dir, "sm_89")).cache_hit);
    NvrtcOptions lines = in(dir);
    lines.line_info = true;
    CHECK(!nvrtc_compile(kSource, "k.cu", lines).cache_hit);
    CHECK(!nvrtc_compile(kSource, "other.cu", in(dir)).cache_hit);
    CHECK(!nvrtc_compile(kSource + "\n", "k.cu", in(dir)).cache_hit);
    CHECK(entries(dir).size() == 5);
    CHECK(nvrtc_compile(kSource, "k.cu", lines).cache_hit);
  }
}

TEST_CASE("nvrtc: a truncated or corrupt cache entry is detected and rebuilt") {
  TempDir dir("nvrtc");
  NvrtcResult good = nvrtc_compile(kSource, "k.cu", in(dir));
  REQUIRE(entries(dir).size() == 1);
  const fs::path entry = entries(dir)[0];
  const std::string whole = read_bytes(entry);

  auto damaged_then_rebuilt = [&](const std::string& bytes) {
    write_bytes(entry, bytes);
    NvrtcResult r = nvrtc_compile(kSource, "k.cu", in(dir));
    CHECK(!r.cache_hit);
    CHECK(r.cubin == good.cubin);
    CHECK(r.ptx == good.ptx);
    CHECK(read_bytes(entry) == whole);  // rewritten whole
    CHECK(nvrtc_compile(kSource, "k.cu", in(dir)).cache_hit);
  };
  SUBCASE("truncated") { damaged_then_rebuilt(whole.substr(0, whole.size() - 100)); }
  SUBCASE("only part of the header") { damaged_then_rebuilt(whole.substr(0, 20)); }
  SUBCASE("empty") { damaged_then_rebuilt(""); }
  SUBCASE("one byte of the cubin flipped") {
    std::string bad = whole;
    bad[88 + good.cubin.size() / 2] ^= 0x10;
    damaged_then_rebuilt(bad);
  }
  SUBCASE("sizes in the header that overflow") {
    std::string bad = whole;
    for (int i = 40; i < 56; ++i) bad[i] = '\xff';
    damaged_then_rebuilt(bad);
  }
  SUBCASE("another key's entry under this key's name") {
    std::string bad = whole;
    bad[8] ^= 1;
    damaged_then_rebuilt(bad);
  }
  SUBCASE("a longer file") { damaged_then_rebuilt(whole + "x"); }
}

TEST_CASE("nvrtc: a kernel cache directory that cannot be made is the user's error, naming it") {
  TempDir dir("nvrtc");
  write_bytes(dir / "file", "in the way");
  NvrtcOptions o;
  o.cache_dir = dir / "file/cache";
  CHECK_THROWS_WITH_AS(nvrtc_compile(kSource, "k.cu", o),
                       doctest::Contains(("the CUDA kernel cache " + (dir / "file/cache") + ": cannot create it").c_str()),
                       std::runtime_error);
  o.use_cache = false;  // --no-cache does not touch it
  CHECK(elf_machine(nvrtc_compile(kSource, "k.cu", o).cubin) == 190);
}

TEST_CASE("nvrtc: the cache directory comes from NAPKIN_CACHE_DIR, then XDG_CACHE_HOME, then HOME, then TMPDIR") {
  TempDir temp("nvrtc");  // temp_directory_path() wants TMPDIR to exist
  EnvVar napkin_dir("NAPKIN_CACHE_DIR", "/a/napkin"), xdg("XDG_CACHE_HOME", "/b/xdg"), home("HOME", "/c/home"),
      tmp("TMPDIR", temp.path);
  CHECK(default_kernel_cache_dir() == "/a/napkin");
  napkin_dir.set(std::nullopt);
  CHECK(default_kernel_cache_dir() == "/b/xdg/napkin/cuda");
  xdg.set(std::nullopt);
  CHECK(default_kernel_cache_dir() == "/c/home/.cache/napkin/cuda");
  home.set(std::nullopt);
  CHECK(default_kernel_cache_dir() == fs::path(temp / fmt::format("napkin-cache-{}/cuda", ::geteuid())));  // one per user
}

// The kernel cache once fell back to a shared /tmp/napkin-cache/cuda and
// loaded any entry whose checksum matched: anyone could plant a cubin for
// another user's trainer. Now it follows codegen/host/private_cache.h, as
// the trainer cache does (tests/e2e/driver_guards_test.cpp).
TEST_CASE("nvrtc: the kernel cache loads only the user's own - 0700 in TMPDIR without HOME, planted cubins not loaded") {
  TempDir tmp("nvrtc-trust");
  EnvVar napkin_dir("NAPKIN_CACHE_DIR", std::nullopt), xdg("XDG_CACHE_HOME", std::nullopt), home("HOME", std::nullopt),
      tmpdir("TMPDIR", tmp.path);
  const NvrtcResult good = nvrtc_compile(kSource, "k.cu", NvrtcOptions{});
  const fs::path root = tmp / fmt::format("napkin-cache-{}", ::geteuid()), cache = root / "cuda";
  REQUIRE(fs::is_directory(cache));
  for (const fs::path& d : {root, cache}) {
    CAPTURE(d);
    struct stat st {};
    REQUIRE(::stat(d.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0700);
  }
  REQUIRE(std::distance(fs::directory_iterator(cache), fs::directory_iterator()) == 1);
  const fs::path entry = fs::directory_iterator(cache)->path();
  const std::string whole = read_bytes(entry);
  CHECK(nvrtc_compile(kSource, "k.cu", NvrtcOptions{}).cache_hit);

  // An entry for this key with a valid header and checksum but someone
  // else's cubin, writable by others: a miss, compiled again and replaced.
  CachedKernels theirs{"PLANTED", good.ptx};
  Sha256 sum;
  sum.update(theirs.cubin);
  sum.update(theirs.ptx);
  const std::array<uint8_t, 32> digest = sum.finish();
  std::string planted = whole.substr(0, 40);  // magic and key
  for (uint64_t size : {uint64_t{theirs.cubin.size()}, uint64_t{theirs.ptx.size()}})
    for (int i = 0; i < 8; ++i) planted += static_cast<char>(size >> (8 * i));
  planted += std::string(reinterpret_cast<const char*>(digest.data()), digest.size()) + theirs.cubin + theirs.ptx;
  write_bytes(entry, planted);
  REQUIRE(::chmod(entry.c_str(), 0666) == 0);
  NvrtcResult rebuilt = nvrtc_compile(kSource, "k.cu", NvrtcOptions{});
  CHECK(!rebuilt.cache_hit);
  CHECK(rebuilt.cubin == good.cubin);
  CHECK(read_bytes(entry) == whole);
  CHECK(napkin::codegen::host::untrusted_entry(entry).empty());
  // The same planted entry, mode 0644 but owned by another user (needs root to make): not loaded either.
  if (::geteuid() == 0) {
    write_bytes(entry, planted);
    REQUIRE(::chmod(entry.c_str(), 0644) == 0);
    REQUIRE(::chown(entry.c_str(), 4242, 4242) == 0);
    CHECK(!nvrtc_compile(kSource, "k.cu", NvrtcOptions{}).cache_hit);
    CHECK(read_bytes(entry) == whole);
  }

  // A cache directory others can write is not trusted at all: an error naming it.
  REQUIRE(::chmod(root.c_str(), 0777) == 0);
  CHECK_THROWS_WITH_AS(nvrtc_compile(kSource, "k.cu", NvrtcOptions{}),
                       doctest::Contains(("the CUDA kernel cache " + root.string() + ": can be written by other users").c_str()),
                       std::runtime_error);
  REQUIRE(::chmod(root.c_str(), 0700) == 0);
  REQUIRE(::chmod(cache.c_str(), 0770) == 0);
  CHECK_THROWS_WITH_AS(nvrtc_compile(kSource, "k.cu", NvrtcOptions{}),
                       doctest::Contains(("the CUDA kernel cache " + cache.string() + ": can be written by other users").c_str()),
                       std::runtime_error);
  REQUIRE(::chmod(cache.c_str(), 0700) == 0);
  CHECK(nvrtc_compile(kSource, "k.cu", NvrtcOptions{}).cache_hit);
}

TEST_CASE("nvrtc: an unknown architecture is the user's error, listing the supported ones") {
  std::vector<std::string> archs = supported_archs();
  CHECK(std::find(archs.begin(), archs.end(), "sm_90") != archs.end());
  for (const char* ok : {"sm_80", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_100f", "sm_120"})
    CHECK_NOTHROW(check_arch(ok));
  for (const char* bad : {"sm_7", "sm_91", "sm_80a", "sm_90f", "compute_90", "90", "sm_90 ", "sm_90b", ""}) {
    CAPTURE(bad);
    try {
      check_arch(bad);
      FAIL("no error");
    } catch (const std::runtime_error& e) {
      std::string m = e.what();
      CHECK(m.find(std::string("--arch ") + bad + ":") == 0);
      CHECK(m.find("sm_80, ") != std::string::npos);
      CHECK(m.find("sm_90, ") != std::string::npos);
    }
  }
  TempDir dir("nvrtc");
  CHECK_THROWS_WITH_AS(nvrtc_compile(kSource, "k.cu", in(dir, "sm_7")), doctest::Contains("not a GPU architecture"),
                       std::runtime_error);
}

TEST_CASE("nvrtc: source NVRTC rejects is napkin's bug, reported with NVRTC's log") {
  TempDir dir("nvrtc");
  std::string broken = "extern \"C\" __global__ void k(float* x) {\n  x[0] = undeclared_thing;\n}\n";
  try {
    nvrtc_compile(broken, "broken.cu", in(dir));
    FAIL("no error");
  } catch (const napkin::ir::InternalError& e) {
    std::string m = e.what();
    CHECK(m.find("NVRTC cannot compile") != std::string::npos);
    CHECK(m.find("broken.cu(2)") != std::string::npos);  // the log's file(line)
    CHECK(m.find("undeclared_thing") != std::string::npos);
    CHECK(m.find("internal error") != std::string::npos);
  }
  CHECK(entries(dir).empty());
}

#endif  // NAPKIN_HAVE_CUDA
