// SPDX-License-Identifier: Apache-2.0
#include "text/tokenizer.h"

#include <fstream>
#include <sstream>
#include <unordered_map>

#include "fp4serve/error.h"
#include "text/tokenizer_added.h"
#include "text/tokenizer_bpe.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_pipeline.h"
#include "text/tokenizer_unicode.h"

namespace fp4serve::text {

using nlohmann::json;
using namespace detail;

struct Tokenizer::Impl {
  std::string source;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  std::vector<AddedToken> added;                   // in tokenizer.json order
  std::unordered_map<int32_t, size_t> added_by_id;  // id → index in `added`
  TokenMap added_by_content;
  std::unique_ptr<AddedTokenMatcher> raw_matcher, normalized_matcher;
  std::optional<int32_t> bos, eos;
  std::optional<bool> add_bos, add_eos;  // tokenizer_config overrides, when the keys are present

  const AddedToken* find_added(int32_t id) const {
    const auto it = added_by_id.find(id);
    return it == added_by_id.end() ? nullptr : &added[it->second];
  }
};

namespace {

std::optional<std::string> config_token(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& v = config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return std::nullopt;
}

std::optional<bool> config_flag(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key) || !config.at(key).is_boolean()) return std::nullopt;
  return config.at(key).get<bool>();
}

void parse_added_tokens(const json& list, Tokenizer::Impl& impl) {
  if (list.is_null()) return;
  const std::string where = impl.source + " added_tokens";
  if (!list.is_array()) throw FormatError(where + ": expected an array");
  // Ids as the library assigns them: the model's id for a known content, else the next id after the model
  // vocabulary (which is what the file's "id" says for every file the library wrote itself).
  int32_t next_id = impl.model->max_id() + 1;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& t = list[i];
    const std::string w = where + "[" + std::to_string(i) + "]";
    AddedToken tok;
    tok.content = get_string(t, "content", w);
    if (tok.content.empty()) continue;
    if (unicode::find_invalid_utf8(tok.content)) throw FormatError(w + ".content: not valid UTF-8");
    tok.special = get_bool(t, "special", false, w);
    tok.single_word = get_bool(t, "single_word", false, w);
    tok.lstrip = get_bool(t, "lstrip", false, w);
    tok.rstrip = get_bool(t, "rstrip", false, w);
    tok.is_normalized = get_bool(t, "normalized", !tok.special, w);
    tok.normalized = tok.content;
    if (tok.is_normalized && impl.normalizer) impl.normalizer->normalize(tok.normalized);
    if (const auto it = impl.added_by_content.find(tok.content); it != impl.added_by_content.end()) {
      tok.id = it->second;
    } else if (const auto mid = impl.model->token_to_id(tok.content)) {
      tok.id = *mid;
    } else {
      tok.id = next_id++;
    }
    impl.added_by_content[tok.content] = tok.id;
    if (const auto it = impl.added_by_id.find(tok.id); it != impl.added_by_id.end()) {
      impl.added[it->second] = tok;  // a later declaration of the same id replaces the earlier one
    } else {
      impl.added_by_id[tok.id] = impl.added.size();
      impl.added.push_back(std::move(tok));
    }
  }
}

}  // namespace

Tokenizer Tokenizer::from_files(const std::filesystem::path& tokenizer_json, const json& tokenizer_config) {
  std::ifstream in(tokenizer_json, std::ios::binary);
  if (!in) throw IoError("cannot open tokenizer file " + tokenizer_json.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  json j;
  try {
    j = json::parse(buffer.str());
  } catch (const json::parse_error& e) {
    throw FormatError(tokenizer_json.string() + ": not valid JSON: " + e.what());
  }
  return from_json(j, tokenizer_config, tokenizer_json.string());
}

Tokenizer Tokenizer::from_json(const json& tok, const json& config, std::string_view source) {
  auto impl = std::make_shared<Impl>();
  impl->source = std::string(source);
  const std::string& src = impl->source;
  if (!tok.is_object()) throw FormatError(src + ": expected a JSON object");
  if (tok.contains("version") && tok.at("version") != "1.0") {
    throw UnsupportedError(src + ": tokenizer.json version " + tok.at("version").dump() + " (expected \"1.0\")");
  }
  auto field = [&](const char* key) -> const json& {
    static const json kNull;
    return tok.contains(key) ? tok.at(key) : kNull;
  };
  impl->model = parse_model(require(tok, "model", src), src + " model");
  impl->normalizer = parse_normalizer(field("normalizer"), src + " normalizer");
  impl->pre_tokenizer = parse_pre_tokenizer(field("pre_tokenizer"), src + " pre_tokenizer");
  impl->post_processor = parse_post_processor(field("post_processor"), src + " post_processor");
  impl->decoder = parse_decoder(field("decoder"), src + " decoder");
  parse_added_tokens(field("added_tokens"), *impl);
  impl->raw_matcher = std::make_unique<AddedTokenMatcher>(impl->added, false);
  impl->normalized_matcher = std::make_unique<AddedTokenMatcher>(impl->added, true);

  Tokenizer result(impl);
  if (const auto b = config_token(config, "bos_token")) impl->bos = result.token_to_id(*b);
  if (const auto e = config_token(config, "eos_token")) impl->eos = result.token_to_id(*e);
  impl->add_bos = config_flag(config, "add_bos_token");
  impl->add_eos = config_flag(config, "add_eos_token");
  return result;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& im = *impl_;
  if (const auto bad = unicode::find_invalid_utf8(text)) {
    throw UsageError("Tokenizer::encode: the text is not valid UTF-8 (byte " + std::to_string(*bad) + " of " +
                     std::to_string(text.size()) + ")");
  }
  std::vector<Piece> pieces;
  pieces.push_back({std::string(text), true, -1});
  // 1. Added tokens that match the raw text; 2. normalize what is left, piece by piece, and match the
  // normalized added tokens in it. (So e.g. a Prepend normalizer applies after every special token.)
  im.raw_matcher->split(pieces);
  if (im.normalizer) {
    for (auto& p : pieces) {
      if (p.token_id < 0) im.normalizer->normalize(p.text);
    }
  }
  im.normalized_matcher->split(pieces);
  if (im.pre_tokenizer) im.pre_tokenizer->pre_tokenize(pieces);

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const auto& p : pieces) {
    if (p.token_id >= 0) {
      ids.push_back(p.token_id);
    } else {
      im.model->tokenize(p.text, ids);
    }
  }
  if (!add_special_tokens) return ids;

  const size_t body = ids.size();
  const size_t front = im.post_processor ? im.post_processor->process(ids) : 0;
  const size_t back = ids.size() - body - front;
  if (im.add_bos && im.bos) {
    const bool has = front > 0 && ids.front() == *im.bos;
    if (*im.add_bos && !has) ids.insert(ids.begin(), *im.bos);
    if (!*im.add_bos && has) ids.erase(ids.begin());
  }
  if (im.add_eos && im.eos) {
    const bool has = back > 0 && ids.back() == *im.eos;
    if (*im.add_eos && !has) ids.push_back(*im.eos);
    if (!*im.add_eos && has) ids.pop_back();
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* a = im.find_added(id)) {
      if (!(skip_special_tokens && a->special)) tokens.push_back(a->normalized);
    } else if (const std::string* t = im.model->id_to_token(id)) {
      // The library skips by content: a vocabulary entry spelled like a special token is skipped too.
      const auto it = im.added_by_content.find(*t);
      const bool special = it != im.added_by_content.end() && im.find_added(it->second) != nullptr &&
                           im.find_added(it->second)->special;
      if (!(skip_special_tokens && special)) tokens.push_back(*t);
    }
  }
  if (!im.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  std::string out;
  for (auto& t : im.decoder->decode_chain(std::move(tokens))) out += t;
  return out;
}

int64_t Tokenizer::vocab_size() const {
  int64_t max_id = impl_->model->max_id();
  for (const auto& a : impl_->added) max_id = std::max<int64_t>(max_id, a.id);
  return max_id + 1;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* a = impl_->find_added(id)) return a->content;
  if (const std::string* t = impl_->model->id_to_token(id)) return *t;
  throw UsageError("Tokenizer::id_to_token: id " + std::to_string(id) + " has no token in " + impl_->source +
                   " (vocab_size " + std::to_string(vocab_size()) + ")");
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

// ------------------------------------------------------------------------------------------------ streaming

namespace {
bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}
}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

namespace {
// Text of `text` beyond what `prefix` already covered: normally text minus prefix. The library raises when the
// window's text no longer starts with the previous one (possible only with decoders that rewrite earlier
// text); emitting from the common prefix, at a character boundary, keeps the stream going instead.
std::string beyond(const std::string& text, const std::string& prefix) {
  size_t common = 0;
  while (common < prefix.size() && common < text.size() && text[common] == prefix[common]) ++common;
  while (common > 0 && common < text.size() && (static_cast<unsigned char>(text[common]) & 0xC0) == 0x80) --common;
  return text.substr(common);
}
}  // namespace

std::string StreamDecoder::push(int32_t id) {
  // The library's step_decode_stream, with "" for its None.
  if (prefix_.empty() && !ids_.empty()) {
    std::string new_prefix = tokenizer_->decode(ids_, skip_special_tokens_);
    if (!ends_with_replacement(new_prefix)) {
      prefix_ = std::move(new_prefix);
      prefix_index_ = ids_.size();
    }
  }
  ids_.push_back(id);
  const std::string text = tokenizer_->decode(ids_, skip_special_tokens_);
  if (text.size() <= prefix_.size() || ends_with_replacement(text)) return {};
  std::string fresh = beyond(text, prefix_);
  const size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tokenizer_->decode(ids_, skip_special_tokens_);
  prefix_index_ = new_prefix_index;
  return fresh;
}

std::string StreamDecoder::flush() {
  std::string rest;
  if (!ids_.empty()) {
    const std::string text = tokenizer_->decode(ids_, skip_special_tokens_);
    if (text.compare(0, prefix_.size(), prefix_) == 0) {
      rest = text.substr(prefix_.size());
    } else {
      // The window decodes differently as a whole (ByteFallback voids a run of bytes that ends invalid):
      // the ids not yet emitted, decoded on their own.
      const std::vector<int32_t> pending(ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_), ids_.end());
      rest = tokenizer_->decode(pending, skip_special_tokens_);
    }
  }
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return rest;
}

}  // namespace fp4serve::text
