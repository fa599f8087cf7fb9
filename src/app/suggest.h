// SPDX-License-Identifier: Apache-2.0
// "Did you mean …?" for a mistyped subcommand, option or path, and what fp4serve does instead of another engine's
// flag (llama.cpp, vLLM, transformers habits).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fp4serve::app {

/// The candidate closest to `word` by Damerau–Levenshtein distance (adjacent transpositions count 1), when that
/// distance is at most max(1, |word| / 3) (or `word` is a prefix of exactly one candidate); nullopt otherwise.
/// Leading dashes are not counted: "--temp" is 2 edits from "--help", too far for a 4-letter name.
std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates);

/// For a flag of llama.cpp, vLLM or transformers that fp4serve does not take (`flag` without its "=value"): one
/// sentence naming the engine and what fp4serve does instead, e.g. "--temp is llama.cpp's spelling; fp4serve's
/// is --temperature …". nullopt for any other text.
std::optional<std::string> foreign_flag_hint(std::string_view flag);

}  // namespace fp4serve::app
