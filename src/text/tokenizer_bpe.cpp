// SPDX-License-Identifier: Apache-2.0
#include "text/tokenizer_bpe.h"

#include <cstdio>
#include <mutex>
#include <queue>

#include "fp4serve/error.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_pipeline.h"
#include "text/tokenizer_unicode.h"

namespace fp4serve::text::detail {

using nlohmann::json;

namespace {

std::optional<std::string> optional_string(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  return get_string(j, key, where);
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

std::unique_ptr<BpeModel> BpeModel::from_json(const json& model, const std::string& where) {
  if (!model.is_object()) throw FormatError(where + ": expected an object");
  const std::string type = model.contains("type") ? get_string(model, "type", where) : "BPE";
  if (type != "BPE") {
    throw UnsupportedError(where + ": model type \"" + type + "\" is not supported (only BPE)");
  }
  if (model.contains("dropout") && !model.at("dropout").is_null() &&
      !(model.at("dropout").is_number() && model.at("dropout").get<double>() == 0.0)) {
    throw UnsupportedError(where + ".dropout: BPE dropout " + model.at("dropout").dump() +
                           " is not supported (must be null for deterministic encoding)");
  }
  auto bpe = std::unique_ptr<BpeModel>(new BpeModel());
  const json& vocab = require(model, "vocab", where);
  if (!vocab.is_object()) throw FormatError(where + ".vocab: expected an object {token: id}");
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      throw FormatError(where + ".vocab[\"" + token + "\"]: expected a non-negative id, found " + id.dump());
    }
    bpe->vocab_.emplace(token, id.get<int32_t>());
    max_id = std::max(max_id, id.get<int32_t>());
  }
  if (max_id >= 0 && static_cast<size_t>(max_id) > 16 * vocab.size() + 1024) {
    throw FormatError(where + ".vocab: ids are too sparse (max id " + std::to_string(max_id) + " for " +
                      std::to_string(vocab.size()) + " tokens)");
  }
  bpe->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  bpe->id_present_.resize(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : bpe->vocab_) {
    bpe->id_to_token_[static_cast<size_t>(id)] = token;
    bpe->id_present_[static_cast<size_t>(id)] = true;
  }

  if (auto unk = optional_string(model, "unk_token", where)) {
    // The library only fails when an unknown character actually needs the token; we check up front.
    const auto it = bpe->vocab_.find(*unk);
    if (it == bpe->vocab_.end()) throw FormatError(where + ".unk_token \"" + *unk + "\" is not in the vocabulary");
    bpe->unk_id_ = it->second;
  }
  bpe->continuing_subword_prefix_ = optional_string(model, "continuing_subword_prefix", where).value_or("");
  bpe->end_of_word_suffix_ = optional_string(model, "end_of_word_suffix", where).value_or("");
  bpe->fuse_unk_ = get_bool(model, "fuse_unk", false, where);
  bpe->byte_fallback_ = get_bool(model, "byte_fallback", false, where);
  bpe->ignore_merges_ = get_bool(model, "ignore_merges", false, where);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const auto it = bpe->vocab_.find(std::string_view(name));
    bpe->byte_ids_[static_cast<size_t>(b)] = it == bpe->vocab_.end() ? -1 : it->second;
  }

  const json& merges = require(model, "merges", where);
  if (!merges.is_array()) throw FormatError(where + ".merges: expected an array");
  const size_t prefix_len = bpe->continuing_subword_prefix_.size();
  int32_t rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string line = m.get<std::string>();
      if (line.rfind("#version", 0) == 0) continue;  // legacy merges.txt header, skipped by the library
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) {
        throw FormatError(where + ".merges[" + std::to_string(i) + "]: expected \"left right\", found \"" + line +
                          "\"");
      }
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      throw FormatError(where + ".merges[" + std::to_string(i) + "]: expected a string or a pair, found " + m.dump());
    }
    const auto ia = bpe->vocab_.find(a), ib = bpe->vocab_.find(b);
    if (ia == bpe->vocab_.end() || ib == bpe->vocab_.end() || b.size() < prefix_len) {
      throw FormatError(where + ".merges[" + std::to_string(i) + "]: \"" + a + "\" or \"" + b +
                        "\" is not in the vocabulary");
    }
    const std::string merged = a + b.substr(prefix_len);
    const auto im = bpe->vocab_.find(merged);
    if (im == bpe->vocab_.end()) {
      throw FormatError(where + ".merges[" + std::to_string(i) + "]: merged token \"" + merged +
                        "\" is not in the vocabulary");
    }
    // A repeated pair keeps its last rank, as the library's HashMap collect does.
    bpe->merges_[pair_key(ia->second, ib->second)] = Merge{rank, im->second};
    ++rank;
  }
  return bpe;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !id_present_[static_cast<size_t>(id)]) {
    return nullptr;
  }
  return &id_to_token_[static_cast<size_t>(id)];
}

const BpeModel::Merge* BpeModel::find_merge(int32_t a, int32_t b) const {
  const auto it = merges_.find(pair_key(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

std::vector<int32_t> BpeModel::merge_word(std::string_view word) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, false});
  };

  // Initial symbols: one per character (with the continuing/end-of-word affixes), else bytes, else unk.
  int32_t pending_unk = -1;  // an unk token not yet added (fuse_unk extends it)
  std::string s;
  for (size_t pos = 0; pos < word.size();) {
    const size_t len = std::min(unicode::sequence_length(static_cast<unsigned char>(word[pos])), word.size() - pos);
    const bool first = pos == 0, last = pos + len == word.size();
    s.assign(first ? "" : continuing_subword_prefix_).append(word.substr(pos, len));
    if (last) s += end_of_word_suffix_;
    pos += len;
    if (const auto it = vocab_.find(s); it != vocab_.end()) {
      if (pending_unk >= 0) add(pending_unk);
      pending_unk = -1;
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : s) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        // Like the library, byte tokens go in before a still-pending unk token.
        for (char c : s) add(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) add(pending_unk);

  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = symbols[static_cast<size_t>(top.pos)];
    if (cur.removed || cur.next < 0) continue;
    const int32_t next_pos = cur.next;
    Symbol& right = symbols[static_cast<size_t>(next_pos)];
    // Stale entry: one side was merged since the candidate was queued.
    const Merge* m = find_merge(cur.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;
    cur.id = top.new_id;
    cur.next = right.next;
    right.removed = true;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const Merge* pm = find_merge(symbols[static_cast<size_t>(cur.prev)].id, cur.id)) {
        queue.push({pm->rank, cur.prev, pm->new_id});
      }
    }
    if (cur.next >= 0) {
      if (const Merge* nm = find_merge(cur.id, symbols[static_cast<size_t>(cur.next)].id)) {
        queue.push({nm->rank, top.pos, nm->new_id});
      }
    }
  }
  std::vector<int32_t> ids;
  for (const auto& sym : symbols) {
    if (!sym.removed) ids.push_back(sym.id);
  }
  return ids;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() < kCacheMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace fp4serve::text::detail
