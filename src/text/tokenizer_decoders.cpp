// SPDX-License-Identifier: Apache-2.0
// Decoders and post-processors of tokenizer.json.
#include <utility>

#include "fp4serve/error.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_pipeline.h"
#include "text/tokenizer_unicode.h"

namespace fp4serve::text::detail {

using nlohmann::json;

namespace {

// ------------------------------------------------------------------------------------------------ decoders

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (const auto& d : parts_) tokens = d->decode_chain(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

class ByteLevelDecoder final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      // A token with any character outside the byte alphabet (an added token like "<|im_start|>" is inside
      // it; "ü" as an added token is not) contributes its UTF-8 bytes unchanged.
      std::string mapped;
      bool all = true;
      for (size_t pos = 0; pos < t.size() && all;) {
        size_t len = 0;
        const int b = char_to_byte(unicode::decode_at(t, pos, len));
        all = b >= 0;
        mapped.push_back(static_cast<char>(b));
        pos += len;
      }
      bytes += all ? mapped : t;
    }
    return {unicode::utf8_lossy(bytes)};
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, PrependScheme scheme) : replacement_(replacement), scheme_(scheme) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t pos = 0; pos < t.size();) {
        size_t len = 0;
        if (unicode::decode_at(t, pos, len) == replacement_) {
          // The library drops every marker of the first token (not only a leading one) unless "never".
          if (i != 0 || scheme_ == PrependScheme::Never) out.push_back(' ');
        } else {
          out.append(t, pos, len);
        }
        pos += len;
      }
      tokens[i] = std::move(out);
    }
    return tokens;
  }

 private:
  char32_t replacement_;
  PrependScheme scheme_;
};

class ByteFallbackDecoder final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (!unicode::find_invalid_utf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");  // one U+FFFD per byte
      }
      pending.clear();
    };
    for (auto& t : tokens) {
      if (const int b = parse_byte_token(t); b >= 0) {
        pending.push_back(static_cast<char>(b));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    return out;
  }

  // "<0xAB>" → 0xAB (either hex case, as u8::from_str_radix accepts); -1 for anything else.
  static int parse_byte_token(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    int v = 0;
    for (char c : t.substr(3, 2)) {
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        return -1;
      }
    }
    return v;
  }
};

class FuseDecoder final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    return {all};
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, code point)
      for (size_t pos = 0; pos < t.size();) {
        size_t len = 0;
        chars.emplace_back(pos, unicode::decode_at(t, pos, len));
        pos += len;
      }
      size_t start_cut = 0;
      for (size_t i = 0; i < start_ && i < chars.size() && chars[i].second == content_; ++i) start_cut = i + 1;
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size() && chars[chars.size() - 1 - i].second == content_; ++i) {
        stop_cut = chars.size() - 1 - i;
      }
      if (stop_cut <= start_cut) {
        t.clear();
        continue;
      }
      const size_t b = start_cut < chars.size() ? chars[start_cut].first : t.size();
      const size_t e = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = t.substr(b, e - b);
    }
    return tokens;
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(const PatternSpec& p, std::string content, const std::string& where)
      : replacer_(p, std::move(content), where) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) t = replacer_.apply(t);
    return tokens;
  }

 private:
  Replacer replacer_;
};

// BPEDecoder: the end-of-word suffix becomes a space, except on the last token where it is dropped.
class BpeSuffixDecoder final : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const Replacer r(PatternSpec{suffix_, false}, i + 1 == tokens.size() ? "" : " ", "BPEDecoder");
      tokens[i] = r.apply(tokens[i]);
    }
    return tokens;
  }

 private:
  std::string suffix_;
};

// ------------------------------------------------------------------------------------------------ post-processors

class SequencePostProcessor final : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  size_t process(std::vector<int32_t>& ids) const override {
    size_t front = 0;
    for (const auto& p : parts_) front += p->process(ids);
    return front;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

class NoSpecialTokens final : public PostProcessor {  // ByteLevel: only adjusts offsets, which we do not keep
 public:
  size_t process(std::vector<int32_t>&) const override { return 0; }
};

class WrapPostProcessor final : public PostProcessor {  // TemplateProcessing (single), Roberta, Bert
 public:
  WrapPostProcessor(std::vector<int32_t> prefix, std::vector<int32_t> suffix)
      : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  size_t process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
    ids.insert(ids.end(), suffix_.begin(), suffix_.end());
    return prefix_.size();
  }

 private:
  std::vector<int32_t> prefix_, suffix_;
};

std::unique_ptr<PostProcessor> parse_template(const json& j, const std::string& where) {
  const json& single = array_field(j, "single", where);
  const json& specials = require(j, "special_tokens", where);
  std::vector<int32_t> prefix, suffix;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& item = single[i];
    const std::string w = where + ".single[" + std::to_string(i) + "]";
    if (item.is_object() && item.contains("Sequence")) {
      if (seen_sequence) throw UnsupportedError(w + ": TemplateProcessing repeats the sequence $A");
      seen_sequence = true;
    } else if (item.is_object() && item.contains("SpecialToken")) {
      const std::string name = get_string(item.at("SpecialToken"), "id", w + ".SpecialToken");
      if (!specials.is_object() || !specials.contains(name)) {
        throw FormatError(w + ": special token \"" + name + "\" is not listed in special_tokens");
      }
      const json& ids = array_field(specials.at(name), "ids", where + ".special_tokens." + name);
      for (const auto& id : ids) {
        if (!id.is_number_integer()) throw FormatError(where + ".special_tokens." + name + ".ids: not an id");
        (seen_sequence ? suffix : prefix).push_back(id.get<int32_t>());
      }
    } else {
      throw FormatError(w + ": expected {\"Sequence\": ...} or {\"SpecialToken\": ...}, found " + item.dump());
    }
  }
  if (!seen_sequence) throw FormatError(where + ".single: the template has no $A sequence");
  return std::make_unique<WrapPostProcessor>(std::move(prefix), std::move(suffix));
}

int32_t pair_id(const json& j, const char* key, const std::string& where) {
  const json& v = require(j, key, where);
  if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer()) {
    throw FormatError(where + "." + key + ": expected [token, id], found " + v.dump());
  }
  return v[1].get<int32_t>();
}

}  // namespace

std::unique_ptr<Decoder> parse_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    const json& list = array_field(j, "decoders", where);
    for (size_t i = 0; i < list.size(); ++i) {
      auto d = parse_decoder(list[i], where + ".decoders[" + std::to_string(i) + "]");
      if (d) parts.push_back(std::move(d));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    return std::make_unique<MetaspaceDecoder>(get_char(j, "replacement", where), parse_prepend_scheme(j, where));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(get_char(j, "content", where), get_size(j, "start", 0, where),
                                          get_size(j, "stop", 0, where));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(get_pattern(j, where), get_string(j, "content", where), where);
  }
  if (type == "BPEDecoder") return std::make_unique<BpeSuffixDecoder>(get_string(j, "suffix", where));
  if (type == "WordPiece") return make_wordpiece_decoder(j, where);
  throw UnsupportedError(where + ": decoder type \"" + type +
                         "\" is not supported (supported: Sequence, ByteLevel, Metaspace, ByteFallback, Fuse, "
                         "Strip, Replace, BPEDecoder)");
}

std::unique_ptr<PostProcessor> parse_post_processor(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> parts;
    const json& list = array_field(j, "processors", where);
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = parse_post_processor(list[i], where + ".processors[" + std::to_string(i) + "]");
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<SequencePostProcessor>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<NoSpecialTokens>();
  if (type == "TemplateProcessing") return parse_template(j, where);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    return std::make_unique<WrapPostProcessor>(std::vector<int32_t>{pair_id(j, "cls", where)},
                                               std::vector<int32_t>{pair_id(j, "sep", where)});
  }
  throw UnsupportedError(where + ": post_processor type \"" + type +
                         "\" is not supported (supported: Sequence, ByteLevel, TemplateProcessing, "
                         "RobertaProcessing, BertProcessing)");
}

}  // namespace fp4serve::text::detail
