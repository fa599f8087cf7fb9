// SPDX-License-Identifier: Apache-2.0
// The pipeline components of BERT-style (WordPiece) and SentencePiece-converted (Unigram) tokenizer.json files:
// BertNormalizer, the Precompiled normalizer (SentencePiece's normalization table) and the WordPiece decoder,
// following the `tokenizers` library (normalizers/bert.rs, normalizers/precompiled.rs with the spm_precompiled
// crate, decoders/wordpiece.rs).
#include <utf8proc.h>

#include <array>
#include <cstring>

#include "fp4serve/error.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_pipeline.h"
#include "text/tokenizer_unicode.h"

namespace fp4serve::text::detail {
namespace {

using nlohmann::json;

utf8proc_category_t category(char32_t cp) { return utf8proc_category(static_cast<utf8proc_int32_t>(cp)); }

// Rust's is_other() of the unicode_categories crate: Cc, Cf, Cs, Co, Cn.
bool is_other(char32_t cp) {
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
      return true;
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO: case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE: case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF: case UTF8PROC_CATEGORY_PO: case UTF8PROC_CATEGORY_SM: case UTF8PROC_CATEGORY_SC:
    case UTF8PROC_CATEGORY_SK: case UTF8PROC_CATEGORY_SO: case UTF8PROC_CATEGORY_ZS: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      return false;
  }
  return false;
}

// The CJK ideograph blocks BERT pads with spaces (bert.rs is_chinese_char).
bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

class BertNormalizer final : public Normalizer {
 public:
  BertNormalizer(bool clean_text, bool chinese, bool strip_accents, bool lowercase)
      : clean_text_(clean_text), chinese_(chinese), strip_accents_(strip_accents), lowercase_(lowercase) {}
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t pos = 0; pos < text.size();) {
      size_t len = 0;
      const char32_t c = unicode::decode_at(text, pos, len);
      pos += len;
      if (clean_text_) {
        const bool ws = c == '\t' || c == '\n' || c == '\r' || unicode::is_white_space(c);
        // The filter runs before the whitespace map: controls (other than \t \n \r) are dropped, even U+0085.
        if (c == 0 || c == 0xFFFD || (!(c == '\t' || c == '\n' || c == '\r') && is_other(c))) continue;
        if (ws) {
          out += ' ';
          continue;
        }
      }
      if (chinese_ && is_chinese_char(c)) {
        out += ' ';
        unicode::append_utf8(out, c);
        out += ' ';
        continue;
      }
      unicode::append_utf8(out, c);
    }
    if (strip_accents_) {
      const std::string decomposed = unicode::normalize(out, unicode::NormalForm::NFD);
      out.clear();
      for (size_t pos = 0; pos < decomposed.size();) {
        size_t len = 0;
        const char32_t c = unicode::decode_at(decomposed, pos, len);
        if (category(c) != UTF8PROC_CATEGORY_MN) out.append(decomposed, pos, len);
        pos += len;
      }
    }
    if (lowercase_) out = unicode::lowercase(out);
    text = std::move(out);
  }

 private:
  bool clean_text_, chinese_, strip_accents_, lowercase_;
};

std::string base64_decode(std::string_view in, const std::string& where) {
  static const auto table = [] {
    std::array<int, 256> t{};
    t.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(alphabet[i])] = i;
    return t;
  }();
  std::string out;
  out.reserve(in.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  for (const char ch : in) {
    if (ch == '=') break;
    const int v = table[static_cast<unsigned char>(ch)];
    if (v < 0) throw FormatError(where + ".precompiled_charsmap: not base64 (character '" + std::string(1, ch) + "')");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return out;
}

// SentencePiece's precompiled charsmap: <trie size: uint32 LE><darts-clone double array><NUL-terminated
// replacement strings>. A trie value is the offset of the replacement of the key it ends.
class PrecompiledNormalizer final : public Normalizer {
 public:
  PrecompiledNormalizer(const std::string& base64, const std::string& where) {
    const std::string blob = base64_decode(base64, where);
    if (blob.size() <= 4) throw FormatError(where + ".precompiled_charsmap: " + std::to_string(blob.size()) + " bytes");
    uint32_t trie_bytes = 0;
    for (int k = 3; k >= 0; --k) trie_bytes = (trie_bytes << 8) | static_cast<unsigned char>(blob[static_cast<size_t>(k)]);
    if (trie_bytes % 4 != 0 || trie_bytes >= blob.size() - 4) {
      throw FormatError(where + ".precompiled_charsmap: trie size " + std::to_string(trie_bytes) + " of a " +
                        std::to_string(blob.size()) + "-byte map");
    }
    units_.resize(trie_bytes / 4);
    for (size_t i = 0; i < units_.size(); ++i) {
      uint32_t u = 0;
      for (int k = 3; k >= 0; --k) u = (u << 8) | static_cast<unsigned char>(blob[4 + i * 4 + static_cast<size_t>(k)]);
      units_[i] = u;
    }
    normalized_ = blob.substr(4 + trie_bytes);
    if (units_.empty()) throw FormatError(where + ".precompiled_charsmap: empty trie");
  }

  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (const auto& grapheme : unicode::graphemes(text)) {
      // As the library (and SentencePiece): a short grapheme is looked up whole, and the replacement of its
      // shortest matching prefix stands for all of it; otherwise character by character.
      if (grapheme.size() < 6) {
        if (const auto r = transform(grapheme)) {
          out += *r;
          continue;
        }
      }
      for (size_t pos = 0; pos < grapheme.size();) {
        const size_t len = unicode::sequence_length(static_cast<unsigned char>(grapheme[pos]));
        const std::string_view ch = grapheme.substr(pos, len);
        if (const auto r = transform(ch)) {
          out += *r;
        } else {
          out += ch;
        }
        pos += len;
      }
    }
    text = std::move(out);
  }

 private:
  static bool has_leaf(uint32_t u) { return ((u >> 8) & 1) != 0; }
  static uint32_t value(uint32_t u) { return u & ((1U << 31) - 1); }
  static uint32_t label(uint32_t u) { return u & ((1U << 31) | 0xFF); }
  static uint32_t offset(uint32_t u) { return (u >> 10) << ((u & (1U << 9)) >> 6); }

  // The replacement of the shortest key that prefixes `chunk`, if any (darts-clone commonPrefixSearch).
  std::optional<std::string_view> transform(std::string_view chunk) const {
    size_t node = 0;
    uint32_t unit = units_[0];
    node ^= offset(unit);
    for (const char ch : chunk) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == 0) break;
      node ^= c;
      if (node >= units_.size()) return std::nullopt;
      unit = units_[node];
      if (label(unit) != c) return std::nullopt;
      node ^= offset(unit);
      if (node >= units_.size()) return std::nullopt;
      if (has_leaf(unit)) {
        const size_t at = value(units_[node]);
        if (at >= normalized_.size()) return std::nullopt;
        const size_t end = normalized_.find('\0', at);
        return std::string_view(normalized_).substr(at, (end == std::string::npos ? normalized_.size() : end) - at);
      }
    }
    return std::nullopt;
  }

  std::vector<uint32_t> units_;
  std::string normalized_;
};

class WordPieceDecoder final : public Decoder {
 public:
  WordPieceDecoder(std::string prefix, bool cleanup) : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      if (i != 0) {
        if (!prefix_.empty() && t.compare(0, prefix_.size(), prefix_) == 0) {
          t.erase(0, prefix_.size());
        } else {
          t = " " + t;
        }
      }
      if (cleanup_) t = cleanup(t);
    }
    return tokens;
  }

 private:
  // decoders/wordpiece.rs cleanup: each replacement over the whole string, in this order.
  static std::string cleanup(std::string s) {
    static const std::pair<const char*, const char*> kRules[] = {
        {" .", "."},    {" ?", "?"},       {" !", "!"},         {" ,", ","},   {" ' ", "'"},  {" n't", "n't"},
        {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& [from, to] : kRules) {
      std::string out;
      const size_t n = std::strlen(from);
      size_t pos = 0;
      for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + n) out.append(s, pos, hit - pos).append(to);
      out.append(s, pos, std::string::npos);
      s = std::move(out);
    }
    return s;
  }
  std::string prefix_;
  bool cleanup_;
};

}  // namespace

bool is_bert_punctuation(char32_t c) {
  if (c < 128) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  switch (category(c)) {
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF: case UTF8PROC_CATEGORY_PO:
      return true;
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
    case UTF8PROC_CATEGORY_SM: case UTF8PROC_CATEGORY_SC: case UTF8PROC_CATEGORY_SK: case UTF8PROC_CATEGORY_SO:
    case UTF8PROC_CATEGORY_ZS: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
      return false;
  }
  return false;
}

std::unique_ptr<Normalizer> make_bert_normalizer(const json& j, const std::string& where) {
  const bool lowercase = get_bool(j, "lowercase", true, where);
  // strip_accents null: follows lowercase.
  const bool strip = get_bool(j, "strip_accents", lowercase, where);
  return std::make_unique<BertNormalizer>(get_bool(j, "clean_text", true, where),
                                          get_bool(j, "handle_chinese_chars", true, where), strip, lowercase);
}

std::unique_ptr<Normalizer> make_precompiled_normalizer(const json& j, const std::string& where) {
  const json& map = require(j, "precompiled_charsmap", where);
  if (map.is_null()) return nullptr;  // the library treats an absent table as the identity
  if (!map.is_string()) throw FormatError(where + ".precompiled_charsmap: expected a base64 string");
  return std::make_unique<PrecompiledNormalizer>(map.get<std::string>(), where);
}

std::unique_ptr<Decoder> make_wordpiece_decoder(const json& j, const std::string& where) {
  return std::make_unique<WordPieceDecoder>(j.contains("prefix") ? get_string(j, "prefix", where) : "##",
                                            get_bool(j, "cleanup", true, where));
}

}  // namespace fp4serve::text::detail
