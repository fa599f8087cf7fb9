// SPDX-License-Identifier: Apache-2.0
// Constrained decoding (structured outputs) on xgrammar's C++ core, the grammar engine vLLM and SGLang use
// (https://github.com/mlc-ai/xgrammar; built from its pinned sdist by scripts/build-xgrammar.sh). A GrammarCompiler
// holds the vocabulary as the engine sees it and turns a GrammarSpec (JSON schema, any JSON, regex, a choice,
// an EBNF or Lark grammar, a structural tag) into a CompiledGrammar; compiled grammars are cached by the engine
// (keyed by the spec's text and options, bounded in bytes). Each constrained sequence owns a GrammarMatcher: before a
// token is sampled it fills the allowed-token bitmask, the sampler masks the logits with it
// (runtime::apply_token_bitmask), and the sampled token is accepted into the matcher.
//
// Built with -DFP4SERVE_XGRAMMAR=OFF, grammar_engine_available() is false and constructing a GrammarCompiler
// throws UnsupportedError; no xgrammar type appears in this header either way.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fp4serve/error.h"

namespace fp4serve::text {
class Tokenizer;
}

namespace fp4serve::runtime {

/// What a request constrains its output to (vLLM's StructuredOutputsParams, one field set).
struct GrammarSpec {
  enum class Kind {
    kJsonSchema,     ///< `source`: a JSON schema (text of a JSON object or boolean)
    kJsonObject,     ///< any JSON object (OpenAI's response_format json_object); `source` unused
    kRegex,          ///< `source`: a regular expression the whole output matches
    kChoice,         ///< `choices`: the output is exactly one of these strings
    kGrammar,        ///< `source`: EBNF (GBNF style, a rule `root ::= …`) or, without "::=", a Lark grammar
    kStructuralTag,  ///< `source`: xgrammar's structural tag JSON ({"type": "structural_tag", "format": …})
  };
  Kind kind = Kind::kJsonObject;
  std::string source;
  std::vector<std::string> choices;
  /// JSON kinds: whitespace between tokens is free (vLLM's default); false: compact separators only
  /// (vLLM's disable_any_whitespace).
  bool any_whitespace = true;
};

/// Bounds on what a request may ask the grammar engine to compile (grammar_limits.cpp). xgrammar has no compile
/// deadline and parses schemas, regexes and EBNF by recursive descent, so a hostile constraint (a schema nested
/// 100 000 levels deep, a megabyte of alternatives, a regex whose repetitions multiply out) could overflow a
/// thread's stack or keep the compiler busy for minutes. Sizes and nesting are checked before the engine sees the
/// text; the time a compile may take is bounded by GrammarCompiler, which runs each compile on a worker and stops
/// waiting at the deadline.
struct GrammarLimits {
  /// Bytes of a schema, regex, grammar or structural tag (a choice list: all strings together). OpenAI caps a
  /// strict schema's strings at 120 000 characters; vLLM has no cap.
  int64_t max_source_bytes = int64_t{128} << 10;
  /// Nesting levels: objects and arrays of a JSON schema or structural tag; parentheses, brackets and braces of
  /// a regex or grammar (outside its string literals and character classes).
  int max_nesting = 64;
  /// Seconds a compile may take; a compile still running then is answered with UsageError and finishes in the
  /// background (the engine cannot be stopped; its result is cached, so the same request is then fast). ≤ 0: no
  /// deadline.
  double compile_timeout_seconds = 10.0;
  /// Compiles that may run at once, on time or past their deadline (the engine finishes an overdue one in the
  /// background): a compile waits up to the deadline for one of them to end, then compile() refuses it
  /// (GrammarBusyError), so that a client cannot stack slow compiles, one after another or all at once.
  int max_overdue_compiles = 2;
};

/// Nesting depth of the JSON text `text` (objects and arrays, outside strings), without parsing it: a scan with a
/// counter, so any depth is safe to measure.
int json_nesting(std::string_view text);
/// End (one past) of the JSON object or array starting at text[start] ('{' or '['), by bracket depth outside
/// strings, with the same scan as json_nesting; npos when it does not end within `text`.
size_t json_container_end(std::string_view text, size_t start);
/// How grammar_nesting reads quotes: an EBNF / Lark grammar's "…" and '…' are literals (their brackets do not count);
/// in a regex a quote is an ordinary character.
enum class GrammarSyntax { kRegex, kEbnf };
/// Nesting depth of a regex or EBNF / Lark grammar: (), [] and {} outside character classes, backslash escapes and
/// (EBNF) "…" / '…' literals.
int grammar_nesting(std::string_view text, GrammarSyntax syntax);

/// "the JSON schema", "the regex", "the grammar", … (for messages).
const char* grammar_spec_description(GrammarSpec::Kind kind);

/// Throws UsageError naming what `spec` is (the JSON schema, the regex, …), its size or nesting and the limit,
/// when it exceeds `limits`. A JSON schema's nesting includes its "pattern" regexes'.
void check_grammar_limits(const GrammarSpec& spec, const GrammarLimits& limits);

/// How tokenizer.json spells its tokens (xgrammar's VocabType): raw bytes, SentencePiece with <0xXX> byte
/// fallback and ▁ for space, or GPT-2's byte-level alphabet (Ġ for space).
enum class VocabEncoding { kRaw, kByteFallback, kByteLevel };

/// The vocabulary as the grammar engine needs it.
struct VocabularyInfo {
  std::vector<std::string> tokens;      ///< by id, as tokenizer.json spells them; "" for ids without a token
  VocabEncoding encoding = VocabEncoding::kRaw;
  bool add_prefix_space = false;        ///< the tokenizer prepends a space to the first word
  int64_t vocab_size = 0;               ///< the model's logits row (≥ tokens.size(); the rest are never allowed)
  std::vector<int32_t> stop_token_ids;  ///< allowed once the grammar is complete (EOS, <|im_end|>, …)
};

/// The vocabulary of `tokenizer` with the encoding and prefix-space rule detected from the text of its
/// tokenizer.json (`tokenizer_json`: xgrammar's TokenizerInfo.DetectMetadataFromHF, which vLLM's
/// TokenizerInfo.from_huggingface uses). Throws UnsupportedError without the engine, UsageError when
/// `tokenizer_json` is not a JSON object.
VocabularyInfo vocabulary_info(const text::Tokenizer& tokenizer, const std::string& tokenizer_json, int64_t vocab_size,
                               std::vector<int32_t> stop_token_ids);

/// Whether this build has the grammar engine (FP4SERVE_XGRAMMAR).
bool grammar_engine_available();
/// "xgrammar 0.2.9" or why there is none.
std::string grammar_engine_description();

class CompiledGrammar;  // immutable, shared by every sequence that uses it

/// compile() refused a constraint because GrammarLimits::max_overdue_compiles compiles (some past their deadline)
/// kept running for a whole deadline, or no thread could be started: the server is busy, not the request wrong
/// (HTTP 503).
class GrammarBusyError : public Error {
 public:
  using Error::Error;
};

class GrammarCompiler {
 public:
  /// Builds the engine's tokenizer info (sorts and indexes the vocabulary: tens of milliseconds for 150k tokens).
  /// `threads`: the engine's compile threads; `cache_bytes`: bound of the compiled-grammar cache (−1: none);
  /// `limits`: what one constraint may cost (grammar_limits.h). Throws UnsupportedError without the engine,
  /// UsageError for an empty vocabulary or limits that are not positive.
  explicit GrammarCompiler(const VocabularyInfo& vocabulary, int threads = 2, int64_t cache_bytes = int64_t{256} << 20,
                           const GrammarLimits& limits = {});
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  /// The compiled grammar of `spec` (from the cache when the same spec was compiled before). Thread-safe. The
  /// engine runs on a worker thread; the caller waits at most limits().compile_timeout_seconds. Throws
  /// UsageError with the engine's message for an invalid or unsatisfiable schema, regex, grammar or structural
  /// tag, or an empty choice list; UsageError naming the limit for a spec over limits() or a compile past its
  /// deadline; GrammarBusyError when limits().max_overdue_compiles compiles run for the whole deadline that the
  /// call waits for one of them to end (so a refusal takes up to two deadlines).
  std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec) const;
  const GrammarLimits& limits() const;
  /// Compiles past their deadline still running in the background.
  int overdue_compiles() const;

  int64_t vocab_size() const;
  /// Bytes the compiled-grammar cache holds now.
  int64_t cache_size_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// int32 words of the allowed-token bitmask for `vocab_size` tokens: token t is allowed when bit t % 32 of word
/// t / 32 is set (xgrammar's layout).
int64_t bitmask_words(int64_t vocab_size);

/// One sequence's position in a grammar. Not thread-safe; one per sequence.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~GrammarMatcher();
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;

  /// The tokens the grammar allows next, [bitmask_words(vocab)] int32 (see bitmask_words); valid until the
  /// next call. Only stop tokens once the grammar is complete.
  std::span<const int32_t> next_token_bitmask();
  /// Advances by `token`; false (state unchanged) when the grammar does not allow it.
  bool accept(int32_t token);
  /// A stop token was accepted: the constrained output has ended.
  bool terminated() const;
  /// The output so far is a complete sentence of the grammar (a stop token may follow).
  bool completed() const;
  int64_t vocab_size() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4serve::runtime
