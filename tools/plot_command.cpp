#include "tools/plot_command.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "tools/files.h"

namespace napkin::tools {

std::optional<std::vector<report::MetricsRun>> read_metrics(const std::string& path, std::string& error) {
  if (error = input_problem(path); !error.empty()) return std::nullopt;  // before opening: opening a FIFO blocks
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = fmt::format("{}: cannot read it", path);
    return std::nullopt;
  }
  return report::parse_metrics(in, path, error);  // a line at a time
}

int plot_command(const std::vector<std::string>& files, std::string output) {
  std::vector<report::MetricsRun> runs;
  for (const std::string& f : files) {
    std::string error;
    std::optional<std::vector<report::MetricsRun>> file_runs = read_metrics(f, error);
    if (!file_runs) {
      std::cerr << "error: " << error << "\n";
      return 1;
    }
    runs.insert(runs.end(), file_runs->begin(), file_runs->end());
  }
  if (output.empty()) output = std::filesystem::path(files.front()).replace_extension(".html").string();
  const std::string extension = std::filesystem::path(output).extension().string();
  if (extension != ".svg" && extension != ".html") {
    std::cerr << fmt::format("error: -o {}: write a .svg or a .html file\n", output);
    return 1;
  }
  if (std::string problem = output_problem("-o", output, files); !problem.empty()) {
    std::cerr << "error: " << problem << "\n";
    return 1;
  }
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  out << (extension == ".svg" ? report::plot_svg(runs) : report::plot_html(runs));
  out.close();
  if (!out) {
    std::cerr << fmt::format("error: -o {}: cannot write it\n", output);
    return 1;
  }
  std::cout << fmt::format("wrote {} ({} run{})\n", output, runs.size(), runs.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace napkin::tools
