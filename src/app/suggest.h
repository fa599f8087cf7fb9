// SPDX-License-Identifier: Apache-2.0
// "Did you mean …?" for a mistyped subcommand or option.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fp4serve::app {

/// The candidate closest to `word` by Damerau–Levenshtein distance (adjacent transpositions count 1), when that
/// distance is at most max(1, |word| / 3) (or `word` is a prefix of exactly one candidate); nullopt otherwise.
std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace fp4serve::app
