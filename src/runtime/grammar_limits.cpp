// SPDX-License-Identifier: Apache-2.0
// The grammar limits of structured_output.h, engine-free: built with and without xgrammar.
#include "runtime/structured_output.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "fp4serve/error.h"

namespace fp4serve::runtime {

const char* grammar_spec_description(GrammarSpec::Kind kind) {
  switch (kind) {
    case GrammarSpec::Kind::kJsonSchema: return "the JSON schema";
    case GrammarSpec::Kind::kJsonObject: return "the JSON object constraint";
    case GrammarSpec::Kind::kRegex: return "the regex";
    case GrammarSpec::Kind::kChoice: return "the choice list";
    case GrammarSpec::Kind::kGrammar: return "the grammar";
    case GrammarSpec::Kind::kStructuralTag: return "the structural tag";
  }
  return "the constraint";
}

namespace {

// The one walk over JSON text both scans share: each '{' / '[' / '}' / ']' outside strings (backslash escapes
// skipped) goes to on_bracket(c), which returns true to stop there. Returns where it stopped, or text.size().
template <typename OnBracket>
size_t walk_json_brackets(std::string_view text, size_t start, OnBracket on_bracket) {
  bool in_string = false;
  for (size_t i = start; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if ((c == '{' || c == '[' || c == '}' || c == ']') && on_bracket(c)) {
      return i;
    }
  }
  return text.size();
}

}  // namespace

int json_nesting(std::string_view text) {
  int depth = 0, deepest = 0;
  walk_json_brackets(text, 0, [&](char c) {
    if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (depth > 0) {
      --depth;
    }
    return false;
  });
  return deepest;
}

size_t json_container_end(std::string_view text, size_t start) {
  int depth = 0;
  const size_t at = walk_json_brackets(text, start, [&](char c) {
    depth += (c == '{' || c == '[') ? 1 : -1;
    return depth == 0;
  });
  return at < text.size() ? at + 1 : std::string_view::npos;
}

int grammar_nesting(std::string_view text, GrammarSyntax syntax) {
  const bool quotes = syntax == GrammarSyntax::kEbnf;  // a regex's quotes are ordinary characters
  int depth = 0, deepest = 0;
  char quote = 0;      // inside a "…" or '…' literal (EBNF)
  bool in_class = false;  // inside a [...] character class (its brackets count once)
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\') {
      ++i;
    } else if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (in_class) {
      if (c == ']') {
        in_class = false;
        --depth;
      }
    } else if (quotes && (c == '"' || c == '\'')) {
      quote = c;
    } else if (c == '[') {
      in_class = true;
      deepest = std::max(deepest, ++depth);
    } else if (c == '(' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ')' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

namespace {

// The deepest regex of the "pattern" strings anywhere in a JSON schema (or a structural tag's schemas): the
// engine compiles each into the grammar, so they nest as deep as their own groups. Called once the JSON's own
// nesting is within the limit, so the walk is bounded; a text that is not JSON is left to the engine's error.
int deepest_pattern(const nlohmann::json& j) {
  int deepest = 0;
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "pattern" && it->is_string()) {
        deepest = std::max(deepest, grammar_nesting(it->get_ref<const std::string&>(), GrammarSyntax::kRegex));
      } else {
        deepest = std::max(deepest, deepest_pattern(*it));
      }
    }
  } else if (j.is_array()) {
    for (const auto& v : j) deepest = std::max(deepest, deepest_pattern(v));
  }
  return deepest;
}

}  // namespace

void check_grammar_limits(const GrammarSpec& spec, const GrammarLimits& limits) {
  const char* what = grammar_spec_description(spec.kind);
  int64_t bytes = static_cast<int64_t>(spec.source.size());
  for (const auto& c : spec.choices) bytes += static_cast<int64_t>(c.size());
  if (bytes > limits.max_source_bytes) {
    throw UsageError(fmt::format("{} is {} bytes; at most {} are accepted (--max-grammar-bytes)", what, bytes,
                                 limits.max_source_bytes));
  }
  int depth = 0;
  switch (spec.kind) {
    case GrammarSpec::Kind::kJsonSchema:
    case GrammarSpec::Kind::kStructuralTag:
      depth = json_nesting(spec.source);
      if (depth <= limits.max_nesting) {
        const nlohmann::json parsed = nlohmann::json::parse(spec.source, nullptr, /*allow_exceptions=*/false);
        if (!parsed.is_discarded()) depth = std::max(depth, deepest_pattern(parsed));
      }
      break;
    case GrammarSpec::Kind::kRegex: depth = grammar_nesting(spec.source, GrammarSyntax::kRegex); break;
    case GrammarSpec::Kind::kGrammar: depth = grammar_nesting(spec.source, GrammarSyntax::kEbnf); break;
    case GrammarSpec::Kind::kJsonObject:
    case GrammarSpec::Kind::kChoice: break;
  }
  if (depth > limits.max_nesting) {
    throw UsageError(fmt::format("{} nests {} levels deep; at most {} are accepted (--max-grammar-nesting)", what,
                                 depth, limits.max_nesting));
  }
}

}  // namespace fp4serve::runtime
