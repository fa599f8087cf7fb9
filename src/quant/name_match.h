// SPDX-License-Identifier: Apache-2.0
// Module-name matching exactly as the producers match their target and ignore lists (docs/FORMATS.md §1.4,
// §3.1): compressed-tensors `re:` patterns with Python `re.match` semantics (anchored at the start only), exact
// module names and class names; ModelOpt fnmatch wildcards. Used by quant_config.cpp; no other module needs it.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace fp4serve::quant {

/// A compiled Python-style regular expression that matches like `re.match(pattern, name)`: anchored at the
/// start of the name only, so `.*mlp.gate` also matches `model.layers.0.mlp.gate_proj` (FORMATS.md §1.4).
/// Compiled once with PCRE2 (`PCRE2_ANCHORED | PCRE2_UTF`); copies share the compiled code. Not thread-safe:
/// each instance owns one match-data block.
class PrefixRegex {
 public:
  /// Compiles `pattern` (without the `re:` prefix). Throws FormatError naming `where` (e.g. "config.json:
  /// quantization_config.ignore[2]") and the PCRE2 message with the offset when the pattern does not compile.
  PrefixRegex(std::string_view pattern, std::string_view where);

  /// True when the pattern matches a prefix of `name` (the match may stop before the end of the name).
  bool matches(std::string_view name) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::shared_ptr<Compiled> compiled_;
};

/// How a compressed-tensors target string matched a module, in the order the producer prefers them
/// (CT `match_targets`: exact names first, then regexes, then class names).
enum class MatchKind : uint8_t { Exact, Regex, ClassName };

std::string_view match_kind_name(MatchKind kind);

/// One entry of a compressed-tensors `targets` or `ignore` list. A string that starts with `re:` is a regex; any
/// other string matches a module whose name equals it or whose class (or a base class) has that name.
class CtTarget {
 public:
  /// Throws FormatError naming `where` when a `re:` pattern does not compile.
  CtTarget(std::string_view text, std::string_view where);

  /// How `text` matches the module `name` whose class hierarchy is `class_names` (most-derived first, e.g.
  /// {"Linear"}); std::nullopt when it does not match.
  std::optional<MatchKind> match(std::string_view name, std::span<const std::string_view> class_names) const;
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  std::optional<PrefixRegex> regex_;
};

/// Python `fnmatch.fnmatchcase(name, pattern)` on POSIX: `*` and `?` also match `.`, `[seq]` and `[!seq]` are
/// character classes, and a backslash is an ordinary character (ModelOpt `exclude_modules`, FORMATS.md §3.1).
bool fnmatch_case(std::string_view pattern, std::string_view name);

}  // namespace fp4serve::quant
