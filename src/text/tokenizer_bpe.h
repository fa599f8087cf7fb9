// SPDX-License-Identifier: Apache-2.0
// The BPE model of a HF tokenizer.json ("model": {"type": "BPE", ...}): vocabulary, ranked merges, byte fallback,
// unknown-token handling and a per-word cache. Merging follows the `tokenizers` library's Word::merge_all: a
// priority queue of candidate pairs ordered by (rank, position), so every word costs O(n log n).
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer_model.h"

namespace fp4serve::text::detail {

/// Heterogeneous-lookup hash so maps keyed by std::string can be searched with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel final : public Model {
 public:
  /// Parses the "model" object. Merges may be "a b" strings or ["a", "b"] pairs; a merge whose parts or result
  /// are not in the vocabulary is a FormatError (as in the library). Throws UnsupportedError for a model type
  /// other than BPE and for a non-null, non-zero `dropout` (random merges have no place in serving).
  static std::unique_ptr<BpeModel> from_json(const nlohmann::json& model, const std::string& where);

  /// Appends the ids of one pre-tokenized word to `out`. Characters that are neither in the vocabulary nor
  /// covered by byte fallback become `unk_token` (fused when fuse_unk) or are dropped when there is none.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const override;

  std::optional<int32_t> token_to_id(std::string_view token) const override;
  /// The vocabulary string of `id`, or nullptr when no token has that id.
  const std::string* id_to_token(int32_t id) const override;
  /// Largest id in the vocabulary, -1 if empty.
  int32_t max_id() const override { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  std::vector<int32_t> merge_word(std::string_view word) const;
  const Merge* find_merge(int32_t a, int32_t b) const;

  TokenMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> id_present_;
  std::unordered_map<uint64_t, Merge> merges_;  // key: (left id << 32) | right id
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_{};  // id of "<0xAB>" per byte, -1 when missing

  // Word cache, as the library's (words under 256 bytes, at most kCacheCapacity entries). Shared lock for
  // lookups so concurrent encodes do not serialize.
  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace fp4serve::text::detail
