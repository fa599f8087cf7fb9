// SPDX-License-Identifier: Apache-2.0
// The model stage of a HF tokenizer.json ("model": {"type": "BPE" | "Unigram" | "WordPiece", ...}): one
// pre-tokenized word in, ids out, plus the vocabulary lookups the rest of the tokenizer needs.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fp4serve::text::detail {

class Model {
 public:
  virtual ~Model() = default;
  /// Appends the ids of one pre-tokenized word to `out`.
  virtual void tokenize(std::string_view word, std::vector<int32_t>& out) const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  /// The vocabulary string of `id`, or nullptr when no token has that id.
  virtual const std::string* id_to_token(int32_t id) const = 0;
  /// Largest id in the vocabulary, -1 if empty.
  virtual int32_t max_id() const = 0;
};

/// Parses the "model" object by its "type" (absent: BPE, as the library's untagged form). Throws
/// UnsupportedError for other types (naming it) and FormatError for malformed fields, naming `where`.
std::unique_ptr<Model> parse_model(const nlohmann::json& model, const std::string& where);

/// Unigram (SentencePiece's model, e.g. T5, ALBERT, XLNet conversions): "vocab" [[piece, log-prob], ...],
/// "unk_id", "byte_fallback". Encoding is the library's Unigram::encode_optimized Viterbi (best total score;
/// characters no piece covers get the unknown token at min score − 10, consecutive unknowns fused).
std::unique_ptr<Model> make_unigram_model(const nlohmann::json& model, const std::string& where);

/// WordPiece (BERT): "vocab" {piece: id}, "unk_token", "continuing_subword_prefix", "max_input_chars_per_word";
/// greedy longest-match-first, a word with any unmatched remainder (or too long) is one unknown token.
std::unique_ptr<Model> make_wordpiece_model(const nlohmann::json& model, const std::string& where);

}  // namespace fp4serve::text::detail
