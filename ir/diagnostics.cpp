#include "ir/diagnostics.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

namespace napkin::ir {

SourceLoc SourceLoc::shifted(int chars) const {
  SourceLoc moved = *this;
  if (moved.col > 0) moved.col += chars;
  return moved;
}

void Diagnostics::add_source(const std::string& file, std::string text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  source_lines_[file] = std::move(lines);
}

const std::vector<std::string>* Diagnostics::source_lines(const std::string& file) const {
  auto it = source_lines_.find(file);
  return it == source_lines_.end() ? nullptr : &it->second;
}

void Diagnostics::error(const SourceLoc& loc, std::string message, std::string hint) {
  diagnostics_.push_back({Severity::Error, loc, std::move(message), std::move(hint)});
  ++error_count_;
}

void Diagnostics::warning(const SourceLoc& loc, std::string message, std::string hint) {
  diagnostics_.push_back({Severity::Warning, loc, std::move(message), std::move(hint)});
}

static const char* severity_word(Severity s) {
  switch (s) {
    case Severity::Error: return "error";
    case Severity::Warning: return "warning";
  }
  return "error";
}

std::string Diagnostics::render_one(const Diagnostic& d) const {
  std::string out;
  if (d.loc.known()) {
    out += fmt::format("{}:{}:", *d.loc.file, d.loc.line);
    if (d.loc.col > 0) out += fmt::format("{}:", d.loc.col);
    out += " ";
  } else if (d.loc.file) {
    out += *d.loc.file + ": ";
  }
  out += fmt::format("{}: {}\n", severity_word(d.severity), d.message);
  if (d.loc.known()) {
    auto it = source_lines_.find(*d.loc.file);
    if (it != source_lines_.end() && d.loc.line <= static_cast<int>(it->second.size())) {
      const std::string& text = it->second[d.loc.line - 1];
      out += "    " + text + "\n";
      if (d.loc.col > 0) {
        // Keep tabs in the caret line so the caret lines up under tab-indented text.
        std::string pad;
        for (int i = 0; i + 1 < d.loc.col && i < static_cast<int>(text.size()); ++i)
          pad += text[i] == '\t' ? '\t' : ' ';
        out += "    " + pad + "^\n";
      }
    }
  }
  if (!d.hint.empty()) out += "    hint: " + d.hint + "\n";
  return out;
}

std::string Diagnostics::render() const {
  std::vector<const Diagnostic*> order;
  for (const auto& d : diagnostics_) order.push_back(&d);
  std::stable_sort(order.begin(), order.end(), [](const Diagnostic* a, const Diagnostic* b) {
    std::string fa = a->loc.file ? *a->loc.file : "", fb = b->loc.file ? *b->loc.file : "";
    if (fa != fb) return fa < fb;
    if (a->loc.line != b->loc.line) return a->loc.line < b->loc.line;
    return a->loc.col < b->loc.col;
  });
  std::string out;
  for (const Diagnostic* d : order) out += render_one(*d);
  if (error_count_ > 0)
    out += fmt::format("{} error{} generated.\n", error_count_, error_count_ == 1 ? "" : "s");
  return out;
}

}  // namespace napkin::ir
