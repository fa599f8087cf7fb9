// SPDX-License-Identifier: Apache-2.0
// Field access for tokenizer.json objects, shared by the pipeline, decoder and model parsers. Every helper
// throws FormatError naming `where` (the JSON path) and the field when the value is missing or mistyped.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace fp4serve::text {
class TokenizerRegex;
}

namespace fp4serve::text::detail {

const nlohmann::json& require(const nlohmann::json& j, const char* key, const std::string& where);
std::string get_string(const nlohmann::json& j, const char* key, const std::string& where);
/// `fallback` when the key is absent or null.
bool get_bool(const nlohmann::json& j, const char* key, bool fallback, const std::string& where);
size_t get_size(const nlohmann::json& j, const char* key, size_t fallback, const std::string& where);
/// A field holding exactly one character (Metaspace replacement, Strip content).
char32_t get_char(const nlohmann::json& j, const char* key, const std::string& where);
/// The "type" of a component object.
std::string type_of(const nlohmann::json& j, const std::string& where);
const nlohmann::json& array_field(const nlohmann::json& j, const char* key, const std::string& where);
std::string utf8_of(char32_t c);

/// A {"String": s} or {"Regex": r} pattern (Replace normalizer/decoder, Split pre-tokenizer).
struct PatternSpec {
  std::string text;
  bool is_regex = false;
};
PatternSpec get_pattern(const nlohmann::json& j, const std::string& where);

/// Replaces every non-overlapping occurrence of a pattern, left to right (the library escapes String patterns
/// into a regex, which is the same as a literal search).
class Replacer {
 public:
  Replacer(const PatternSpec& p, std::string content, const std::string& where);
  std::string apply(std::string_view s) const;

 private:
  std::string literal_;
  std::shared_ptr<TokenizerRegex> regex_;
  std::string content_;
};

/// Metaspace's prepend_scheme; older files carry only add_prefix_space (false → Never, true/absent → Always).
enum class PrependScheme { First, Never, Always };
PrependScheme parse_prepend_scheme(const nlohmann::json& j, const std::string& where);

}  // namespace fp4serve::text::detail
