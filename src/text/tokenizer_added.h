// SPDX-License-Identifier: Apache-2.0
// Added tokens (tokenizer.json "added_tokens"): ids, flags, and matching them inside input text the way the
// `tokenizers` library's AddedVocabulary does (leftmost-longest, single_word / lstrip / rstrip).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer_pipeline.h"

namespace fp4serve::text::detail {

struct AddedToken {
  int32_t id = -1;
  std::string content;     // as written in tokenizer.json
  std::string normalized;  // content after the normalizer when `normalized` is set (what is matched and decoded)
  bool special = false, single_word = false, lstrip = false, rstrip = false, is_normalized = true;
};

/// Leftmost-longest matcher over a set of added tokens (a byte trie).
class AddedTokenMatcher {
 public:
  /// `tokens` must outlive the matcher; `use_normalized` selects which spelling is matched.
  AddedTokenMatcher(const std::vector<AddedToken>& tokens, bool normalized_set);
  bool empty() const { return nodes_.size() == 1; }

  /// Splits every piece without a token into text pieces and matched-token pieces (the library's
  /// split_with_indices), dropping empty pieces. A sub-piece keeps `at_origin` only when it starts at byte 0.
  void split(std::vector<Piece>& pieces) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;  // index into tokens_ when a token ends here
  };
  int32_t child(int32_t node, unsigned char byte) const;
  void split_text(const Piece& piece, std::vector<Piece>& out) const;

  const std::vector<AddedToken>* tokens_;
  std::vector<Node> nodes_;
  bool root_has_[256] = {};
};

}  // namespace fp4serve::text::detail
