// SPDX-License-Identifier: Apache-2.0
#include "text/tokenizer_added.h"

#include <algorithm>

#include "text/tokenizer_unicode.h"

namespace fp4serve::text::detail {

namespace {

// Code point ending at byte `end` (exclusive) of valid UTF-8 `s`.
char32_t last_char(std::string_view s, size_t end, size_t& start) {
  start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t len = 0;
  return unicode::decode_at(s, start, len);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens, bool normalized_set)
    : tokens_(&tokens), nodes_(1) {
  for (size_t t = 0; t < tokens.size(); ++t) {
    const AddedToken& tok = tokens[t];
    if (tok.is_normalized != normalized_set) continue;
    const std::string& key = normalized_set ? tok.normalized : tok.content;
    if (key.empty()) continue;
    int32_t node = 0;
    for (unsigned char b : key) {
      int32_t next = child(node, b);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[static_cast<size_t>(node)].children.emplace_back(b, next);
        nodes_.emplace_back();
      }
      node = next;
    }
    nodes_[static_cast<size_t>(node)].token = static_cast<int32_t>(t);
    root_has_[static_cast<unsigned char>(key[0])] = true;
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char byte) const {
  for (const auto& [b, n] : nodes_[static_cast<size_t>(node)].children) {
    if (b == byte) return n;
  }
  return -1;
}

void AddedTokenMatcher::split_text(const Piece& piece, std::vector<Piece>& out) const {
  const std::string_view s = piece.text;
  size_t start_offset = 0;
  auto emit_text = [&](size_t b, size_t e) {
    if (e > b) out.push_back({std::string(s.substr(b, e - b)), piece.at_origin && b == 0, -1});
  };
  for (size_t i = 0; i < s.size();) {
    if (!root_has_[static_cast<unsigned char>(s[i])]) {
      ++i;
      continue;
    }
    // Longest token starting at i.
    int32_t best = -1;
    size_t best_end = 0;
    int32_t node = 0;
    for (size_t j = i; j < s.size(); ++j) {
      node = child(node, static_cast<unsigned char>(s[j]));
      if (node < 0) break;
      if (nodes_[static_cast<size_t>(node)].token >= 0) {
        best = nodes_[static_cast<size_t>(node)].token;
        best_end = j + 1;
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = (*tokens_)[static_cast<size_t>(best)];
    size_t start = i, stop = best_end;
    i = best_end;  // the automaton resumes after the match whether or not it is kept
    if (tok.single_word) {
      size_t cs = 0;
      const bool start_space = start == 0 || !unicode::is_word_char(last_char(s, start, cs));
      size_t len = 0;
      const bool stop_space = stop == s.size() || !unicode::is_word_char(unicode::decode_at(s, stop, len));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t cs = 0;
        if (!unicode::is_white_space(last_char(s, new_start, cs))) break;
        new_start = cs;
      }
      // Spaces an earlier match already consumed stay with it.
      start = std::max(new_start, start_offset);
    }
    if (tok.rstrip) {
      while (stop < s.size()) {
        size_t len = 0;
        if (!unicode::is_white_space(unicode::decode_at(s, stop, len))) break;
        stop += len;
      }
    }
    if (start_offset < start) emit_text(start_offset, start);
    out.push_back({std::string(s.substr(start, stop - start)), piece.at_origin && start == 0, tok.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) emit_text(start_offset, s.size());
}

void AddedTokenMatcher::split(std::vector<Piece>& pieces) const {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (auto& p : pieces) {
    if (p.token_id >= 0) {
      out.push_back(std::move(p));
    } else if (empty()) {
      if (!p.text.empty()) out.push_back(std::move(p));
    } else {
      split_text(p, out);
    }
  }
  pieces = std::move(out);
}

}  // namespace fp4serve::text::detail
