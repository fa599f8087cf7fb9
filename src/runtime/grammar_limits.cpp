// SPDX-License-Identifier: Apache-2.0
// The grammar limits of structured_output.h, engine-free: built with and without xgrammar.
#include "runtime/structured_output.h"

#include <fmt/format.h>

#include <algorithm>

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

int json_nesting(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

int grammar_nesting(std::string_view text) {
  int depth = 0, deepest = 0;
  char quote = 0;      // inside a "…" or '…' literal
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
    } else if (c == '"' || c == '\'') {
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
    case GrammarSpec::Kind::kStructuralTag: depth = json_nesting(spec.source); break;
    case GrammarSpec::Kind::kRegex:
    case GrammarSpec::Kind::kGrammar: depth = grammar_nesting(spec.source); break;
    case GrammarSpec::Kind::kJsonObject:
    case GrammarSpec::Kind::kChoice: break;
  }
  if (depth > limits.max_nesting) {
    throw UsageError(fmt::format("{} nests {} levels deep; at most {} are accepted (--max-grammar-nesting)", what,
                                 depth, limits.max_nesting));
  }
}

}  // namespace fp4serve::runtime
