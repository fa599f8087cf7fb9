// SPDX-License-Identifier: Apache-2.0
// The stages of a HF tokenizer.json around the model: normalizers, pre-tokenizers, decoders and post-processors,
// each parsed from its JSON object. Semantics follow the `tokenizers` library (Rust crate, v0.23) component by
// component; each class names the behaviour it reproduces where it is not obvious.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fp4serve::text::detail {

/// One piece of the input on its way through the pipeline (the `tokenizers` library's "split").
struct Piece {
  std::string text;
  /// True when the piece starts at byte 0 of the original input. Metaspace's prepend_scheme "first" adds its
  /// marker only to such a piece (the library tests the piece's original offset == 0).
  bool at_origin = false;
  /// >= 0: the piece is an added token matched in the text, already final; -1: still to be tokenized.
  int32_t token_id = -1;
};

/// A normalizer rewrites the text of one piece.
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

/// A pre-tokenizer splits (and may rewrite) the pieces that have no token yet; pieces with a token pass through.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

/// A decoder turns the token strings of a sequence into text; `decode_chain` may change the number of strings,
/// and the final text is their concatenation.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens) const = 0;
};

/// A post-processor adds special tokens around the ids of one sequence (only called for add_special_tokens).
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  /// Inserts the special ids into `ids` and returns how many were put in front of the sequence.
  virtual size_t process(std::vector<int32_t>& ids) const = 0;
};

/// Parsers: `where` names the JSON path for error messages, e.g. "tokenizer.json normalizer.normalizers[1]".
/// A JSON null gives nullptr (the stage is absent). Throws UnsupportedError naming a component type fp4serve
/// does not implement (e.g. "UnicodeScripts", "CTC") and FormatError for malformed fields.
std::unique_ptr<Normalizer> parse_normalizer(const nlohmann::json& j, const std::string& where);
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const nlohmann::json& j, const std::string& where);
std::unique_ptr<Decoder> parse_decoder(const nlohmann::json& j, const std::string& where);
std::unique_ptr<PostProcessor> parse_post_processor(const nlohmann::json& j, const std::string& where);

/// BERT / SentencePiece components (tokenizer_bert.cpp), used by the parsers above.
std::unique_ptr<Normalizer> make_bert_normalizer(const nlohmann::json& j, const std::string& where);
std::unique_ptr<Normalizer> make_precompiled_normalizer(const nlohmann::json& j, const std::string& where);
std::unique_ptr<Decoder> make_wordpiece_decoder(const nlohmann::json& j, const std::string& where);
/// BertPreTokenizer's punctuation: ASCII punctuation or a Unicode P* category.
bool is_bert_punctuation(char32_t c);

/// GPT-2's reversible map from bytes to printable code points (the ByteLevel alphabet).
char32_t byte_to_char(unsigned char b);
/// The inverse of byte_to_char; -1 for code points outside the alphabet.
int char_to_byte(char32_t c);

}  // namespace fp4serve::text::detail
