// "did you mean ...?" suggestions for misspelled names.
#pragma once

#include <string>
#include <vector>

namespace napkin::frontend {

// The closest candidate by edit distance if it is close enough to be a likely
// typo (at most a third of the word's length), else "".
std::string closest_name(const std::string& word, const std::vector<std::string>& candidates);

// "; did you mean 'x'?" or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace napkin::frontend
