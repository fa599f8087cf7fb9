// SPDX-License-Identifier: Apache-2.0
// Unigram and WordPiece models, following the `tokenizers` library (models/unigram/model.rs encode_optimized and
// tokenize; models/wordpiece/mod.rs tokenize).
#include <algorithm>
#include <limits>
#include <unordered_map>

#include "fp4serve/error.h"
#include "text/tokenizer_bpe.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_model.h"
#include "text/tokenizer_unicode.h"

namespace fp4serve::text::detail {
namespace {

using nlohmann::json;

// Unknown characters score this much below the least likely piece (sentencepiece's kUnkPenalty).
constexpr double kUnkPenalty = 10.0;

class UnigramModel final : public Model {
 public:
  UnigramModel(const json& model, const std::string& where) {
    const json& vocab = array_field(model, "vocab", where);
    pieces_.reserve(vocab.size());
    scores_.reserve(vocab.size());
    for (size_t i = 0; i < vocab.size(); ++i) {
      const json& e = vocab[i];
      const std::string at = where + ".vocab[" + std::to_string(i) + "]";
      if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number()) {
        throw FormatError(at + ": expected [piece, score], found " + e.dump());
      }
      pieces_.push_back(e[0].get<std::string>());
      scores_.push_back(e[1].get<double>());
      // The library keeps the first id of a duplicated piece.
      ids_.emplace(pieces_.back(), static_cast<int32_t>(i));
      max_piece_bytes_ = std::max(max_piece_bytes_, pieces_.back().size());
      min_score_ = std::min(min_score_, scores_.back());
    }
    if (model.contains("unk_id") && !model.at("unk_id").is_null()) {
      const json& u = model.at("unk_id");
      if (!u.is_number_integer() || u.get<int64_t>() < 0 || u.get<int64_t>() >= static_cast<int64_t>(pieces_.size())) {
        throw FormatError(where + ".unk_id: " + u.dump() + " is not an id of the " + std::to_string(pieces_.size()) +
                          "-piece vocabulary");
      }
      unk_id_ = static_cast<int32_t>(u.get<int64_t>());
    }
    byte_fallback_ = get_bool(model, "byte_fallback", false, where);
    if (byte_fallback_) {
      for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        const auto it = ids_.find(name);
        byte_ids_[static_cast<size_t>(b)] = it == ids_.end() ? -1 : it->second;
      }
    }
  }

  void tokenize(std::string_view word, std::vector<int32_t>& out) const override {
    for (const auto& piece : encode(word)) {
      if (const auto it = ids_.find(piece); it != ids_.end()) {
        out.push_back(it->second);
        continue;
      }
      // A fused run of unknown characters: bytes when every byte has a token, else the unknown token.
      if (byte_fallback_ && std::all_of(piece.begin(), piece.end(), [&](char c) {
            return byte_ids_[static_cast<unsigned char>(c)] >= 0;
          })) {
        for (char c : piece) out.push_back(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
      if (!unk_id_) throw UsageError("Unigram model: the text has characters outside the vocabulary and no unk_id");
      out.push_back(*unk_id_);
    }
  }

  std::optional<int32_t> token_to_id(std::string_view token) const override {
    const auto it = ids_.find(token);
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* id_to_token(int32_t id) const override {
    return id >= 0 && static_cast<size_t>(id) < pieces_.size() ? &pieces_[static_cast<size_t>(id)] : nullptr;
  }
  int32_t max_id() const override { return static_cast<int32_t>(pieces_.size()) - 1; }

 private:
  struct Node {
    int32_t id = -1;
    double score = 0.0;
    size_t starts_at = std::numeric_limits<size_t>::max();  // max: not reached yet
  };

  // Best segmentation of `s` into piece strings (unknown runs fused), as encode_optimized.
  std::vector<std::string> encode(std::string_view s) const {
    std::vector<std::string> result;
    if (s.empty()) return result;
    const size_t n = s.size();
    const double unk_score = min_score_ - kUnkPenalty;
    std::vector<Node> best(n + 1);
    best[0].starts_at = 0;
    for (size_t start = 0; start < n;) {
      const double here = best[start].score;
      size_t len = 0;
      unicode::decode_at(s, start, len);
      const size_t char_len = len;
      bool single = false;
      // Every vocabulary piece that is a prefix of s[start:], shortest first (the trie's common-prefix search).
      for (size_t end = start + char_len; end <= n && end - start <= max_piece_bytes_;) {
        const auto it = ids_.find(s.substr(start, end - start));
        if (it != ids_.end()) {
          Node& target = best[end];
          const double candidate = here + scores_[static_cast<size_t>(it->second)];
          if (target.starts_at == std::numeric_limits<size_t>::max() || candidate > target.score) {
            target = {it->second, candidate, start};
          }
          if (end - start == char_len) single = true;
        }
        if (end == n) break;
        size_t next_len = 0;
        unicode::decode_at(s, end, next_len);
        end += next_len;
      }
      if (!single) {
        if (!unk_id_) throw UsageError("Unigram model: a character has no piece and the model has no unk_id");
        Node& target = best[start + char_len];
        const double candidate = here + unk_score;
        if (target.starts_at == std::numeric_limits<size_t>::max() || candidate > target.score) {
          target = {*unk_id_, candidate, start};
        }
      }
      start += char_len;
    }
    std::string unknown_run;  // built backwards, so pieces are prepended
    for (size_t end = n; end > 0;) {
      const Node& node = best[end];
      const size_t start = node.starts_at;
      const std::string piece(s.substr(start, end - start));
      if (unk_id_ && node.id == *unk_id_) {
        unknown_run = piece + unknown_run;
      } else {
        if (!unknown_run.empty()) result.push_back(std::move(unknown_run));
        unknown_run.clear();
        result.push_back(piece);
      }
      end = start;
    }
    if (!unknown_run.empty()) result.push_back(std::move(unknown_run));
    std::reverse(result.begin(), result.end());
    return result;
  }

  std::vector<std::string> pieces_;
  std::vector<double> scores_;
  TokenMap ids_;
  size_t max_piece_bytes_ = 0;
  double min_score_ = std::numeric_limits<double>::infinity();
  std::optional<int32_t> unk_id_;
  bool byte_fallback_ = false;
  std::array<int32_t, 256> byte_ids_{};
};

class WordPieceModel final : public Model {
 public:
  WordPieceModel(const json& model, const std::string& where) {
    const json& vocab = require(model, "vocab", where);
    if (!vocab.is_object()) throw FormatError(where + ".vocab: expected an object {token: id}");
    for (const auto& [token, id] : vocab.items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        throw FormatError(where + ".vocab[\"" + token + "\"]: expected a non-negative integer id, found " + id.dump());
      }
      const auto i = static_cast<size_t>(id.get<int64_t>());
      if (i >= id_to_token_.size()) {
        id_to_token_.resize(i + 1);
        present_.resize(i + 1, false);
      }
      id_to_token_[i] = token;
      present_[i] = true;
      vocab_.emplace(token, static_cast<int32_t>(i));
    }
    unk_token_ = get_string(model, "unk_token", where);
    prefix_ = model.contains("continuing_subword_prefix") ? get_string(model, "continuing_subword_prefix", where) : "##";
    max_chars_ = get_size(model, "max_input_chars_per_word", 100, where);
    const auto unk = vocab_.find(unk_token_);
    if (unk == vocab_.end()) throw FormatError(where + ".unk_token: \"" + unk_token_ + "\" is not in the vocabulary");
    unk_id_ = unk->second;
  }

  void tokenize(std::string_view word, std::vector<int32_t>& out) const override {
    size_t chars = 0;
    for (size_t pos = 0; pos < word.size(); pos += unicode::sequence_length(static_cast<unsigned char>(word[pos]))) ++chars;
    if (chars > max_chars_) {
      out.push_back(unk_id_);
      return;
    }
    const size_t mark = out.size();
    std::string candidate;
    for (size_t start = 0; start < word.size();) {
      size_t end = word.size();
      int32_t found = -1;
      while (start < end) {
        candidate = start > 0 ? prefix_ : std::string();
        candidate.append(word.substr(start, end - start));
        if (const auto it = vocab_.find(candidate); it != vocab_.end()) {
          found = it->second;
          break;
        }
        do --end;  // drop the last character
        while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80);
      }
      if (found < 0) {
        out.resize(mark);
        out.push_back(unk_id_);
        return;
      }
      out.push_back(found);
      start = end;
    }
  }

  std::optional<int32_t> token_to_id(std::string_view token) const override {
    const auto it = vocab_.find(token);
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* id_to_token(int32_t id) const override {
    return id >= 0 && static_cast<size_t>(id) < id_to_token_.size() && present_[static_cast<size_t>(id)]
               ? &id_to_token_[static_cast<size_t>(id)]
               : nullptr;
  }
  int32_t max_id() const override { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  TokenMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> present_;
  std::string unk_token_, prefix_;
  size_t max_chars_ = 100;
  int32_t unk_id_ = 0;
};

}  // namespace

std::unique_ptr<Model> make_unigram_model(const json& model, const std::string& where) {
  return std::make_unique<UnigramModel>(model, where);
}

std::unique_ptr<Model> make_wordpiece_model(const json& model, const std::string& where) {
  return std::make_unique<WordPieceModel>(model, where);
}

std::unique_ptr<Model> parse_model(const json& model, const std::string& where) {
  if (!model.is_object()) throw FormatError(where + ": expected an object");
  const std::string type = model.contains("type") ? get_string(model, "type", where) : "BPE";
  if (type == "BPE") return BpeModel::from_json(model, where);
  if (type == "Unigram") return make_unigram_model(model, where);
  if (type == "WordPiece") return make_wordpiece_model(model, where);
  throw UnsupportedError(where + ": model type \"" + type + "\" is not supported (supported: BPE, Unigram, WordPiece)");
}

}  // namespace fp4serve::text::detail
