#include "frontend/suggest.h"

#include <algorithm>
#include <cctype>

namespace napkin::frontend {

namespace {
bool same_letter(char x, char y) {
  return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
}

// Edit distance, case-insensitive (a wrong case is the most common typo), where
// swapping two neighbouring letters counts as one edit ("inti" -> "init"), as
// in optimal string alignment.
int edit_distance(const std::string& a, const std::string& b) {
  std::vector<int> prev2(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same_letter(a[i - 1], b[j - 1]) ? 0 : 1)});
      if (i > 1 && j > 1 && same_letter(a[i - 1], b[j - 2]) && same_letter(a[i - 2], b[j - 1]))
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

std::string closest_name(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  int best_distance = std::max<int>(1, static_cast<int>(word.size()) / 3) + 1;
  for (const std::string& c : candidates) {
    int d = edit_distance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best = closest_name(word, candidates);
  return best.empty() ? "" : "; did you mean '" + best + "'?";
}

}  // namespace napkin::frontend
