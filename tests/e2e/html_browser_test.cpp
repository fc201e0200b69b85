// `napkin report --html` and `napkin plot` in a real browser: headless
// Chromium (Debian's chromium, which tools/test.sh installs) loads the page,
// must log no console error, and its DOM after loading must still carry the
// JSON report's numbers; a screenshot is taken. Skipped, with a message,
// where no Chromium is installed.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "support/test_io.h"

namespace {

using napkin::testing::read_bytes;
using napkin::testing::TempDir;
using Run = napkin::testing::CommandResult;
Run sh(const std::string& command) { return napkin::testing::run_in_source_tree(command); }

std::string chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    Run r = sh(fmt::format("command -v {}", name));
    if (r.status == 0) return name;
  }
  return "";
}

// The browser, headless, on `file` with `flags`; its console on stderr.
Run browse(const std::string& browser, const TempDir& dir, const std::string& flags, const std::string& file) {
  return sh(fmt::format("HOME={0} timeout 120 {1} --headless --no-sandbox --disable-gpu --user-data-dir={0}/profile "
                        "--enable-logging=stderr --v=0 {2} file://{3}",
                        dir.path, browser, flags, file));
}

// Where there is no browser: the test says so and passes.
void skip() { MESSAGE("skipped: no Chromium here (tools/test.sh installs Debian's chromium)"); }

// Console messages the page logged (Chromium prints them as CONSOLE lines).
bool console_errors(const std::string& log) { return log.find(":CONSOLE") != std::string::npos || log.find("Uncaught") != std::string::npos; }

// PNG width and height from its IHDR chunk.
std::pair<int, int> png_size(const std::string& png) {
  REQUIRE(png.size() > 24);
  REQUIRE(png.compare(1, 3, "PNG") == 0);
  auto be32 = [&](size_t at) {
    return (static_cast<unsigned char>(png[at]) << 24) | (static_cast<unsigned char>(png[at + 1]) << 16) |
           (static_cast<unsigned char>(png[at + 2]) << 8) | static_cast<unsigned char>(png[at + 3]);
  };
  return {static_cast<int>(be32(16)), static_cast<int>(be32(20))};
}

}  // namespace

TEST_CASE("html in a browser: the gpt2-124m report renders without console errors and keeps the JSON report's numbers") {
  const std::string browser = chromium();
  if (browser.empty()) return skip();
  TempDir dir("html");
  const std::string page = dir.path + "/gpt2.html";
  Run made = sh(fmt::format("{} report models/gpt2-124m.yaml --device h100 --html {}", NAPKIN_BINARY, page));
  INFO(made.out);
  REQUIRE(made.status == 0);
  Run json = sh(fmt::format("{} report models/gpt2-124m.yaml --device h100 --json --no-ops 2>/dev/null", NAPKIN_BINARY));
  REQUIRE(json.status == 0);
  const nlohmann::json report = nlohmann::json::parse(json.out);

  Run dom = browse(browser, dir, "--dump-dom", page);
  INFO(dom.out.substr(0, 2000));
  REQUIRE(dom.status == 0);
  CHECK_FALSE(console_errors(dom.out));
  // The DOM the browser built: the timeline's peak and the summary's FLOPs
  // are the JSON report's.
  std::smatch m;
  REQUIRE(std::regex_search(dom.out, m, std::regex("class=\"timeline\" data-peak=\"([0-9]+)\"")));  // one short match
  CHECK(std::stod(m[1].str()) == report.at("memory").at("peak").get<double>());
  CHECK(dom.out.find("<svg") != std::string::npos);
  CHECK(dom.out.find("class=\"kernel\"") != std::string::npos);
  const std::string open = "<script type=\"application/json\" class=\"napkin-report\">";
  const size_t begin = dom.out.find(open), end = dom.out.find("</script>", begin);
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  const nlohmann::json embedded = nlohmann::json::parse(dom.out.substr(begin + open.size(), end - begin - open.size()));
  CHECK(embedded.at("flops").at("total") == report.at("flops").at("total"));
  CHECK(embedded.at("time").at("step_s") == report.at("time").at("step_s"));

  Run shot = browse(browser, dir, fmt::format("--screenshot={}/gpt2.png --window-size=1200,1800", dir.path), page);
  INFO(shot.out);
  CHECK_FALSE(console_errors(shot.out));
  const std::string png = read_bytes(dir.path + "/gpt2.png");
  CHECK(png_size(png) == std::pair<int, int>{1200, 1800});
  CHECK(png.size() > 50'000);  // charts, not a blank page
}

TEST_CASE("html in a browser: napkin plot's page of a trainer's metrics renders without console errors") {
  const std::string browser = chromium();
  if (browser.empty()) return skip();
  TempDir dir("plot");
  Run trained = sh(fmt::format("{} train models/gpt.yaml --dims batch=2,seq=16,d=32,heads=2,layers=1 -- --steps 20 "
                               "--log-every 2 --eval-every 10 --checkpoint-every 0 --metrics {}/m.jsonl",
                               NAPKIN_BINARY, dir.path));
  INFO(trained.out);
  REQUIRE(trained.status == 0);
  CHECK(trained.out.find(fmt::format("napkin plot {}/m.jsonl", dir.path)) != std::string::npos);
  Run plot = sh(fmt::format("{} plot {}/m.jsonl -o {}/m.html", NAPKIN_BINARY, dir.path, dir.path));
  INFO(plot.out);
  REQUIRE(plot.status == 0);
  Run dom = browse(browser, dir, "--dump-dom", dir.path + "/m.html");
  REQUIRE(dom.status == 0);
  CHECK_FALSE(console_errors(dom.out));
  // Train loss (10 logged steps), eval loss (2), tokens/s and MFU (10 each).
  const std::regex points("data-points=\"([0-9]+)\"");
  std::vector<int> counts;
  for (auto it = std::sregex_iterator(dom.out.begin(), dom.out.end(), points); it != std::sregex_iterator(); ++it)
    counts.push_back(std::stoi((*it)[1].str()));
  CHECK(counts == std::vector<int>{10, 2, 10, 10});
}

TEST_CASE("html: --compare-precision puts the model under another policy beside it, --compare another model") {
  TempDir dir("html-compare");
  Run r = sh(fmt::format("{} report models/gpt.yaml --html {}/p.html --compare-precision bf16-mixed", NAPKIN_BINARY,
                         dir.path));
  INFO(r.out);
  REQUIRE(r.status == 0);
  const std::string page = read_bytes(dir.path + "/p.html");
  CHECK(page.find("<td>fp32, adamw</td>") != std::string::npos);
  CHECK(page.find("<td>bf16-mixed, adamw</td>") != std::string::npos);
  Run other = sh(fmt::format("{} report models/gpt.yaml --html {}/o.html --compare models/mlp.yaml", NAPKIN_BINARY,
                             dir.path));
  REQUIRE(other.status == 0);
  CHECK(read_bytes(dir.path + "/o.html").find("data-model=\"mlp\"") != std::string::npos);
  Run both = sh(fmt::format("{} report models/gpt.yaml --html {}/b.html --compare models/mlp.yaml --compare-dims d=64",
                            NAPKIN_BINARY, dir.path));
  CHECK(both.status == 1);
  CHECK(both.out.find("one second model at a time") != std::string::npos);
}
