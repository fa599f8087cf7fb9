// SPDX-License-Identifier: Apache-2.0
// Text ⇄ token ids from a Hugging Face tokenizer.json, reproducing the `tokenizers` library (v0.23) pipeline:
// added/special tokens → normalizer → pre-tokenizer → BPE → post-processor, and the decoder chain back.
// Supported: BPE models (ByteLevel families: GPT-2, Llama-3, Qwen2, SmolLM2; SentencePiece-style families with
// Metaspace/Prepend+Replace and byte_fallback: Llama-2, Mistral, TinyLlama). Anything else is an
// UnsupportedError that names the component. See tests/data/tokenizers/README.md for the verified families.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fp4serve::text {

class Tokenizer {
 public:
  /// Loads `tokenizer_json` (HF tokenizer.json, "version": "1.0") and takes bos/eos and add_bos_token /
  /// add_eos_token from `tokenizer_config` (the parsed tokenizer_config.json; pass a null json when absent).
  /// Throws IoError when the file cannot be read, FormatError when it is not valid JSON or a field is
  /// malformed (the message gives the JSON path, e.g. "tokenizer.json model.merges[17]"), UnsupportedError
  /// for a component type that is not implemented (the message names it). `truncation` and `padding` in the
  /// file are ignored: callers decide lengths.
  static Tokenizer from_files(const std::filesystem::path& tokenizer_json, const nlohmann::json& tokenizer_config);

  /// The same from already parsed JSON; `source` names it in error messages.
  static Tokenizer from_json(const nlohmann::json& tokenizer_json, const nlohmann::json& tokenizer_config,
                             std::string_view source = "tokenizer.json");

  /// Token ids of `text` (UTF-8). Added and special tokens written in the text are matched as the library
  /// does (non-normalized ones on the raw text, then normalized ones on each normalized piece, leftmost-longest,
  /// honouring single_word / lstrip / rstrip). With `add_special_tokens` the post-processor adds its tokens
  /// (e.g. BOS), adjusted by tokenizer_config's add_bos_token / add_eos_token when those keys are present:
  /// true adds bos_id/eos_id if the post-processor did not, false removes a BOS/EOS the post-processor put there
  /// (transformers' LlamaTokenizerFast behaviour). Throws UsageError if `text` is not valid UTF-8.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;

  /// Text of `ids` through the decoder chain, as the library's decode: ids with no token are skipped, special
  /// added tokens are dropped when `skip_special_tokens`, invalid UTF-8 becomes U+FFFD as the decoder dictates.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  /// 1 + the largest id of the model vocabulary and the added tokens: the number of rows an embedding table
  /// indexed by these ids needs (ids without a token, if any, are counted).
  int64_t vocab_size() const;

  /// Id of an exact token string (added tokens first, then the model vocabulary, as in the library), e.g.
  /// token_to_id("<|im_end|>"); byte-level tokens use the mapped alphabet ("Ġthe"). nullopt when absent.
  std::optional<int32_t> token_to_id(std::string_view token) const;

  /// Token string of `id` (the added token's content, else the vocabulary entry). Throws UsageError for an id
  /// that has no token.
  std::string id_to_token(int32_t id) const;

  /// Ids of tokenizer_config's bos_token / eos_token (a string or an {"content": ...} object); nullopt when the
  /// config is null, has no such key or names a token that does not exist.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // immutable and thread-safe; copies of a Tokenizer share it
};

/// Incremental detokenization for streaming, with the algorithm of the library's DecodeStream: decode a short
/// window of recent ids and emit only the text beyond what the window already produced, holding back output
/// while it ends in U+FFFD (an incomplete UTF-8 sequence from byte-level or byte-fallback pieces). So the
/// concatenation of every push() and the final flush() equals decode(all ids), and each chunk is whole UTF-8.
/// Keeps a reference to the Tokenizer, which must outlive it.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);

  /// Adds one id and returns the text it completes (often empty while a character is still incomplete).
  std::string push(int32_t id);

  /// Returns whatever is still held back (an invalid trailing sequence decodes to U+FFFD, as decode does) and
  /// resets the decoder for a new stream.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;  // the window: ids that produced prefix_, then ids not yet emitted
  std::string prefix_;        // decode of ids_[0, prefix_index_)
  size_t prefix_index_ = 0;
};

}  // namespace fp4serve::text
