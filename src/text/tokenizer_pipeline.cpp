// SPDX-License-Identifier: Apache-2.0
// Normalizers and pre-tokenizers of tokenizer.json, plus the JSON field helpers and the ByteLevel alphabet.
#include "text/tokenizer_pipeline.h"

#include <algorithm>
#include <array>
#include <functional>
#include <utility>

#include "fp4serve/error.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_regex.h"
#include "text/tokenizer_unicode.h"

namespace fp4serve::text::detail {

using nlohmann::json;

// ------------------------------------------------------------------------------------------------ JSON helpers

const json& require(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) {
    throw FormatError(where + ": missing field \"" + key + "\"");
  }
  return j.at(key);
}

std::string get_string(const json& j, const char* key, const std::string& where) {
  const json& v = require(j, key, where);
  if (!v.is_string()) throw FormatError(where + "." + key + ": expected a string, found " + v.dump());
  return v.get<std::string>();
}

bool get_bool(const json& j, const char* key, bool fallback, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  const json& v = j.at(key);
  if (!v.is_boolean()) throw FormatError(where + "." + key + ": expected true/false, found " + v.dump());
  return v.get<bool>();
}

size_t get_size(const json& j, const char* key, size_t fallback, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  const json& v = j.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < 0) {
    throw FormatError(where + "." + key + ": expected a count, found " + v.dump());
  }
  return v.get<size_t>();
}

// A field holding exactly one character (Metaspace replacement, Strip content).
char32_t get_char(const json& j, const char* key, const std::string& where) {
  const std::string s = get_string(j, key, where);
  size_t len = 0;
  if (s.empty() || unicode::find_invalid_utf8(s) || (unicode::decode_at(s, 0, len), len != s.size())) {
    throw FormatError(where + "." + key + ": expected exactly one character, found \"" + s + "\"");
  }
  return unicode::decode_at(s, 0, len);
}

std::string type_of(const json& j, const std::string& where) {
  if (!j.is_object()) throw FormatError(where + ": expected an object, found " + j.dump());
  return get_string(j, "type", where);
}

const json& array_field(const json& j, const char* key, const std::string& where) {
  const json& v = require(j, key, where);
  if (!v.is_array()) throw FormatError(where + "." + key + ": expected an array");
  return v;
}

PatternSpec get_pattern(const json& j, const std::string& where) {
  const json& p = require(j, "pattern", where);
  if (p.is_object() && p.size() == 1 && p.contains("String") && p.at("String").is_string()) {
    return {p.at("String").get<std::string>(), false};
  }
  if (p.is_object() && p.size() == 1 && p.contains("Regex") && p.at("Regex").is_string()) {
    return {p.at("Regex").get<std::string>(), true};
  }
  throw FormatError(where + ".pattern: expected {\"String\": ...} or {\"Regex\": ...}, found " + p.dump());
}

std::string utf8_of(char32_t c) {
  std::string s;
  unicode::append_utf8(s, c);
  return s;
}

Replacer::Replacer(const PatternSpec& p, std::string content, const std::string& where)
    : content_(std::move(content)) {
  if (p.is_regex) {
    regex_ = std::make_shared<TokenizerRegex>(p.text, where);
  } else {
    literal_ = p.text;
  }
}

std::string Replacer::apply(std::string_view s) const {
  std::string out;
  size_t prev = 0;
  if (regex_) {
    for (const auto& [b, e] : regex_->find_all(s)) {
      out.append(s.substr(prev, b - prev)).append(content_);
      prev = e;
    }
  } else if (!literal_.empty()) {
    for (size_t at = s.find(literal_); at != std::string_view::npos; at = s.find(literal_, prev)) {
      out.append(s.substr(prev, at - prev)).append(content_);
      prev = at + literal_.size();
    }
  }
  out.append(s.substr(prev));
  return out;
}

PrependScheme parse_prepend_scheme(const json& j, const std::string& where) {
  // Older files carry only add_prefix_space: true/absent means "always", false means "never". (The library
  // rejects add_prefix_space=false unless prepend_scheme is "never"; we accept it with "always" or no scheme.)
  PrependScheme scheme = PrependScheme::Always;
  if (j.contains("prepend_scheme") && !j.at("prepend_scheme").is_null()) {
    const std::string s = get_string(j, "prepend_scheme", where);
    if (s == "first") {
      scheme = PrependScheme::First;
    } else if (s == "never") {
      scheme = PrependScheme::Never;
    } else if (s == "always") {
      scheme = PrependScheme::Always;
    } else {
      throw FormatError(where + ".prepend_scheme: expected first, never or always, found \"" + s + "\"");
    }
  }
  if (!get_bool(j, "add_prefix_space", true, where)) {
    if (scheme != PrependScheme::Always && scheme != PrependScheme::Never) {
      throw FormatError(where + ": add_prefix_space=false contradicts prepend_scheme");
    }
    scheme = PrependScheme::Never;
  }
  return scheme;
}

// Rust regex's \w and \s spelled with PCRE2 properties, so Whitespace splits exactly as the library does.
constexpr std::string_view kWhitespacePattern =
    R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}]+|[^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}\p{White_Space}]+)";

namespace {

// ------------------------------------------------------------------------------------------------ splitting

struct Segment {
  size_t begin, end;
  bool is_match;
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

SplitBehavior parse_behavior(const json& j, const std::string& where) {
  const std::string b = get_string(j, "behavior", where);
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  throw FormatError(where + ".behavior: unknown split behavior \"" + b + "\"");
}

// The library's Pattern::find_matches: segments covering the whole text, matches flagged.
std::vector<Segment> regex_segments(const TokenizerRegex& re, std::string_view text) {
  std::vector<Segment> out;
  if (text.empty()) return {{0, 0, false}};
  size_t prev = 0;
  for (const auto& [b, e] : re.find_all(text)) {
    if (prev != b) out.push_back({prev, b, false});
    out.push_back({b, e, true});
    prev = e;
  }
  if (prev != text.size()) out.push_back({prev, text.size(), false});
  return out;
}

// Pattern for a char predicate: every matching character is its own match.
std::vector<Segment> char_segments(std::string_view text, const std::function<bool(char32_t)>& pred) {
  std::vector<Segment> out;
  if (text.empty()) return {{0, 0, false}};
  size_t last = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t len = 0;
    const char32_t c = unicode::decode_at(text, pos, len);
    if (pred(c)) {
      if (last < pos) out.push_back({last, pos, false});
      out.push_back({pos, pos + len, true});
      last = pos + len;
    }
    pos += len;
  }
  if (last < text.size()) out.push_back({last, text.size(), false});
  return out;
}

// NormalizedString::split: apply the delimiter behavior, then cut, dropping removed and empty parts.
void split_piece(const Piece& piece, std::vector<Segment> segs, SplitBehavior behavior, bool invert,
                 std::vector<Piece>& out) {
  if (invert) {
    for (auto& s : segs) s.is_match = !s.is_match;
  }
  std::vector<std::pair<Segment, bool>> parts;  // (range, removed)
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (const auto& s : segs) parts.push_back({s, false});
      break;
    case SplitBehavior::Removed:
      for (const auto& s : segs) parts.push_back({s, s.is_match});
      break;
    case SplitBehavior::Contiguous:
      for (const auto& s : segs) {
        if (s.is_match == previous_match && !parts.empty()) {
          parts.back().first.end = s.end;
        } else {
          parts.push_back({s, false});
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::MergedWithPrevious:
      for (const auto& s : segs) {
        if (s.is_match && !previous_match && !parts.empty()) {
          parts.back().first.end = s.end;
        } else {
          parts.push_back({s, false});
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::MergedWithNext:
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->is_match && !previous_match && !parts.empty()) {
          parts.back().first.begin = it->begin;
        } else {
          parts.push_back({*it, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
  }
  for (const auto& [seg, removed] : parts) {
    if (removed || seg.end == seg.begin) continue;
    out.push_back({piece.text.substr(seg.begin, seg.end - seg.begin), piece.at_origin && seg.begin == 0, -1});
  }
}

// Applies `fn` to every piece without a token, replacing it by the pieces `fn` appends.
template <typename Fn>
void split_each(std::vector<Piece>& pieces, Fn&& fn) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (auto& p : pieces) {
    if (p.token_id >= 0) {
      out.push_back(std::move(p));
    } else {
      fn(p, out);
    }
  }
  pieces = std::move(out);
}

// ------------------------------------------------------------------------------------------------ normalizers

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& n : parts_) n->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(unicode::NormalForm form) : form_(form) {}
  void normalize(std::string& text) const override { text = unicode::normalize(text, form_); }

 private:
  unicode::NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override { text = unicode::lowercase(text); }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t len = 0;
        if (!unicode::is_white_space(unicode::decode_at(text, begin, len))) break;
        begin += len;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t len = 0;
        if (!unicode::is_white_space(unicode::decode_at(text, start, len))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text = prefix_ + text;
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(const PatternSpec& p, std::string content, const std::string& where)
      : replacer_(p, std::move(content), where) {}
  void normalize(std::string& text) const override { text = replacer_.apply(text); }

 private:
  Replacer replacer_;
};

// ------------------------------------------------------------------------------------------------ pre-tokenizers

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space),
        regex_(use_regex ? std::make_unique<TokenizerRegex>(kGpt2Pattern, "ByteLevel") : nullptr) {}

  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](Piece& p, std::vector<Piece>& out) {
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text = " " + p.text;
      if (regex_) {
        split_piece(p, regex_segments(*regex_, p.text), SplitBehavior::Isolated, false, out);
      } else if (!p.text.empty()) {
        out.push_back(std::move(p));
      }
    });
    for (auto& p : pieces) {
      if (p.token_id >= 0) continue;
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (char c : p.text) unicode::append_utf8(mapped, byte_to_char(static_cast<unsigned char>(c)));
      p.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<TokenizerRegex> regex_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(const PatternSpec& p, SplitBehavior behavior, bool invert, const std::string& where)
      : regex_(p.is_regex ? p.text : TokenizerRegex::escape(p.text), where), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](Piece& p, std::vector<Piece>& out) {
      split_piece(p, regex_segments(regex_, p.text), behavior_, invert_, out);
    });
  }

 private:
  TokenizerRegex regex_;
  SplitBehavior behavior_;
  bool invert_;
};

class CharSplitPreTokenizer final : public PreTokenizer {
 public:
  CharSplitPreTokenizer(std::function<bool(char32_t)> pred, SplitBehavior behavior)
      : pred_(std::move(pred)), behavior_(behavior) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](Piece& p, std::vector<Piece>& out) {
      split_piece(p, char_segments(p.text, pred_), behavior_, false, out);
    });
  }

 private:
  std::function<bool(char32_t)> pred_;
  SplitBehavior behavior_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split)
      : replacement_(replacement), rep_(utf8_of(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](Piece& p, std::vector<Piece>& out) {
      std::string text;
      for (char c : p.text) {
        if (c == ' ') {
          text += rep_;
        } else {
          text.push_back(c);
        }
      }
      p.text = std::move(text);
      const bool starts = p.text.compare(0, rep_.size(), rep_) == 0;
      switch (scheme_) {
        case PrependScheme::Always:
          if (!starts) p.text = rep_ + p.text;
          break;
        case PrependScheme::First:
          if (!starts && p.at_origin) p.text = rep_ + p.text;
          break;
        case PrependScheme::Never:
          break;
      }
      if (split_) {
        const char32_t r = replacement_;
        split_piece(p, char_segments(p.text, [r](char32_t c) { return c == r; }), SplitBehavior::MergedWithNext,
                    false, out);
      } else if (!p.text.empty()) {
        out.push_back(std::move(p));
      }
    });
  }

 private:
  char32_t replacement_;
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

}  // namespace

// ------------------------------------------------------------------------------------------------ byte alphabet

namespace {
struct ByteTables {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 512> to_byte{};  // every alphabet code point is below 0x144
  ByteTables() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[static_cast<size_t>(b)]] = static_cast<int16_t>(b);
    }
  }
};
const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}
}  // namespace

char32_t byte_to_char(unsigned char b) { return byte_tables().to_char[b]; }

int char_to_byte(char32_t c) { return c < 512 ? byte_tables().to_byte[c] : -1; }

// ------------------------------------------------------------------------------------------------ parsers

std::unique_ptr<Normalizer> parse_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    const json& list = array_field(j, "normalizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      auto n = parse_normalizer(list[i], where + ".normalizers[" + std::to_string(i) + "]");
      if (n) parts.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(get_bool(j, "strip_left", false, where),
                                             get_bool(j, "strip_right", false, where));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(get_string(j, "prepend", where));
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(get_pattern(j, where), get_string(j, "content", where), where);
  }
  if (type == "BertNormalizer") return make_bert_normalizer(j, where);
  if (type == "Precompiled") return make_precompiled_normalizer(j, where);
  throw UnsupportedError(where + ": normalizer type \"" + type +
                         "\" is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
                         "Prepend, Replace, BertNormalizer, Precompiled)");
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    const json& list = array_field(j, "pretokenizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = parse_pre_tokenizer(list[i], where + ".pretokenizers[" + std::to_string(i) + "]");
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "ByteLevel") {
    // trim_offsets only affects offsets, which fp4serve does not report.
    return std::make_unique<ByteLevelPreTokenizer>(get_bool(j, "add_prefix_space", true, where),
                                                   get_bool(j, "use_regex", true, where));
  }
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(get_pattern(j, where), parse_behavior(j, where),
                                               get_bool(j, "invert", false, where), where);
  }
  if (type == "Digits") {
    return std::make_unique<CharSplitPreTokenizer>(
        unicode::is_numeric,
        get_bool(j, "individual_digits", false, where) ? SplitBehavior::Isolated : SplitBehavior::Contiguous);
  }
  if (type == "Metaspace") {
    return std::make_unique<MetaspacePreTokenizer>(get_char(j, "replacement", where), parse_prepend_scheme(j, where),
                                                   get_bool(j, "split", true, where));
  }
  if (type == "Whitespace") {
    // The library keeps the regex matches and drops what lies between them (Invert + Removed).
    return std::make_unique<SplitPreTokenizer>(PatternSpec{std::string(kWhitespacePattern), true},
                                               SplitBehavior::Removed, true, where);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<CharSplitPreTokenizer>(unicode::is_white_space, SplitBehavior::Removed);
  }
  if (type == "BertPreTokenizer") {
    // Whitespace removed, then every punctuation character isolated.
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    parts.push_back(std::make_unique<CharSplitPreTokenizer>(unicode::is_white_space, SplitBehavior::Removed));
    parts.push_back(std::make_unique<CharSplitPreTokenizer>(is_bert_punctuation, SplitBehavior::Isolated));
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  throw UnsupportedError(where + ": pre_tokenizer type \"" + type +
                         "\" is not supported (supported: Sequence, ByteLevel, Split, Digits, Metaspace, "
                         "Whitespace, WhitespaceSplit, BertPreTokenizer)");
}

}  // namespace fp4serve::text::detail
