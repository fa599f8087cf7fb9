// SPDX-License-Identifier: Apache-2.0
// Test doubles for the server's two seams. FakeModel: the next-token logits are a pure function of the whole
// sequence so far (a hash), so any scheduler bookkeeping error (a wrong position, mixed-up slots, a lost or
// repeated token) changes the output; it also rejects a chunk that does not continue its slot's history.
// ByteCodec: one token per byte, id 256 = EOS. reference_greedy() is the independent sequential loop the
// batched results are compared with.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/step_model.h"
#include "server/text_codec.h"

namespace fp4serve::server::testing {

inline constexpr int64_t kVocab = 260;
inline constexpr int32_t kEos = 256;

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Logits after `history`: printable ASCII (32…126) and EOS get hash-derived values in [0, 1) (EOS scaled by
/// `eos_scale`, so it is rarely the argmax), everything else −100.
inline std::vector<float> fake_logits(std::span<const int32_t> history, float eos_scale = 0.97f) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the ids
  for (const int32_t t : history) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  std::vector<float> logits(kVocab, -100.0f);
  for (int v = 32; v < 127; ++v) logits[v] = static_cast<float>(splitmix64(h + static_cast<uint64_t>(v)) >> 40) / 16777216.0f;
  logits[kEos] = eos_scale * static_cast<float>(splitmix64(h + kEos) >> 40) / 16777216.0f;
  return logits;
}

/// Greedy generation one token at a time, no scheduler: the reference.
inline std::vector<int32_t> reference_greedy(std::vector<int32_t> history, int64_t max_new, bool ignore_eos) {
  std::vector<int32_t> out;
  while (static_cast<int64_t>(out.size()) < max_new) {
    const auto logits = fake_logits(history);
    int32_t best = 0;
    for (int32_t v = 1; v < kVocab; ++v) {
      if (logits[static_cast<size_t>(v)] > logits[static_cast<size_t>(best)]) best = v;
    }
    if (best == kEos && !ignore_eos) break;
    out.push_back(best);
    history.push_back(best);
  }
  return out;
}

class FakeModel final : public StepModel {
 public:
  FakeModel(int slots, int64_t max_len) : max_len_(max_len), in_use_(static_cast<size_t>(slots)), history_(static_cast<size_t>(slots)) {}

  int64_t vocab_size() const override { return kVocab; }
  int64_t max_seq_len() const override { return max_len_; }
  int max_slots() const override { return static_cast<int>(in_use_.size()); }
  int acquire_slot() override {
    for (size_t i = 0; i < in_use_.size(); ++i) {
      if (!in_use_[i]) {
        in_use_[i] = true;
        history_[i].clear();
        ++used_;
        max_used = std::max(max_used.load(), used_);
        return static_cast<int>(i);
      }
    }
    return -1;
  }
  void release_slot(int slot) override {
    if (slot < 0 || slot >= max_slots() || !in_use_[static_cast<size_t>(slot)]) throw std::logic_error("bad release");
    in_use_[static_cast<size_t>(slot)] = false;
    --used_;
  }
  bool can_copy_prefix() const override { return copies_enabled; }
  void copy_prefix(int src, int dst, int64_t positions) override {
    if (!copies_enabled) throw std::logic_error("copy_prefix while disabled");
    auto& from = history_.at(static_cast<size_t>(src));
    auto& to = history_.at(static_cast<size_t>(dst));
    if (!in_use_[static_cast<size_t>(src)] || !in_use_[static_cast<size_t>(dst)] || !to.empty() ||
        positions > static_cast<int64_t>(from.size())) {
      throw std::logic_error("bad copy_prefix");
    }
    to.assign(from.begin(), from.begin() + positions);
    ++copies;
  }
  std::vector<float> forward(std::span<const StepChunk> chunks) override {
    if (before_forward) before_forward();
    ++steps;
    int64_t tokens = 0;
    bool has_decode = false, has_prefill = false;
    std::vector<float> out;
    for (const auto& c : chunks) {
      if (c.slot < 0 || c.slot >= max_slots() || !in_use_[static_cast<size_t>(c.slot)]) throw std::logic_error("chunk on a free slot");
      auto& hist = history_[static_cast<size_t>(c.slot)];
      if (c.start_pos != static_cast<int64_t>(hist.size())) throw std::logic_error("chunk does not continue its slot");
      if (c.tokens.empty() || c.start_pos + static_cast<int64_t>(c.tokens.size()) > max_len_) throw std::logic_error("bad chunk size");
      hist.insert(hist.end(), c.tokens.begin(), c.tokens.end());
      const auto logits = fake_logits(hist);
      out.insert(out.end(), logits.begin(), logits.end());
      tokens += static_cast<int64_t>(c.tokens.size());
      tokens_in += static_cast<int64_t>(c.tokens.size());
      (c.tokens.size() == 1 ? has_decode : has_prefill) = true;
    }
    max_chunks = std::max<int64_t>(max_chunks.load(), static_cast<int64_t>(chunks.size()));
    max_tokens = std::max(max_tokens.load(), tokens);
    if (has_decode && has_prefill) ++mixed_steps;
    return out;
  }

  std::function<void()> before_forward;  ///< runs on the scheduler thread at the start of every step
  std::atomic<int64_t> steps{0}, max_chunks{0}, max_tokens{0}, mixed_steps{0};
  std::atomic<int64_t> tokens_in{0};   ///< every token forwarded (prefill + decode)
  std::atomic<int64_t> copies{0};      ///< copy_prefix calls
  std::atomic<bool> copies_enabled{true};
  std::atomic<int> max_used{0};

 private:
  int64_t max_len_;
  std::vector<bool> in_use_;
  std::vector<std::vector<int32_t>> history_;
  int used_ = 0;
};

class ByteCodec final : public TextCodec {
 public:
  std::vector<int32_t> encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids;
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  std::string render_chat(const std::vector<ChatTurn>& messages) const override {
    std::string s;
    for (const auto& m : messages) s += "<" + m.role + ">" + m.content + "\n";
    return s + "<assistant>";
  }
  std::unique_ptr<Detokenizer> detokenizer() const override {
    struct Bytes final : Detokenizer {
      std::string push(int32_t id) override { return id < 256 ? std::string(1, static_cast<char>(id)) : std::string(); }
      std::string flush() override { return {}; }
    };
    return std::make_unique<Bytes>();
  }
  int64_t vocab_size() const override { return kVocab; }
  std::vector<int32_t> eos_token_ids() const override { return {kEos}; }
};

inline std::string bytes_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (const int32_t id : ids) s += static_cast<char>(id);
  return s;
}

}  // namespace fp4serve::server::testing
