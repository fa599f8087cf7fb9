// SPDX-License-Identifier: Apache-2.0
#include "app/suggest.h"

#include <algorithm>

namespace fp4serve::app {
namespace {

// Optimal string alignment distance (Damerau–Levenshtein without repeated edits of a substring).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  if (word.empty()) return std::nullopt;
  std::optional<std::string> prefix_match;
  size_t prefix_count = 0;
  std::optional<std::string> best;
  size_t best_distance = std::max<size_t>(1, word.size() / 3) + 1;
  for (const std::string& c : candidates) {
    if (c.starts_with(word)) {
      ++prefix_count;
      prefix_match = c;
    }
    const size_t d = edit_distance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  if (best) return best;
  if (prefix_count == 1) return prefix_match;
  return std::nullopt;
}

}  // namespace fp4serve::app
