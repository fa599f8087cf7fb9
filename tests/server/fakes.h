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

// The fake's KV cache is a real paged KvCache (bookkeeping only: the fake keeps each slot's tokens itself), so the
// scheduler's block accounting, preemption and prefix matching run as against the decoder.
class FakeModel final : public StepModel {
 public:
  /// `slots` sequences of up to `max_len` positions; `num_blocks` blocks of `block_size` (0: every slot at full
  /// length), prefix caching on or off; `layer_windows`: one layer per entry with that attention window (empty: one
  /// layer attending to all positions), as KvCacheSpec::layer_windows.
  FakeModel(int slots, int64_t max_len, int64_t num_blocks = 0, int64_t block_size = 16, bool prefix_caching = false,
            std::vector<int64_t> layer_windows = {})
      : cache_(std::max<int64_t>(1, static_cast<int64_t>(layer_windows.size())), 1, 1,
               model::KvCacheSpec{max_len, slots, num_blocks, block_size, 0, layer_windows}),
        history_(static_cast<size_t>(slots)) {
    cache_.set_prefix_caching(prefix_caching);
  }

  int64_t vocab_size() const override { return kVocab; }
  model::KvCache& cache() override { return cache_; }
  const model::KvCache& cache() const override { return cache_; }
  std::vector<float> forward(std::span<const StepChunk> chunks) override {
    if (before_forward) before_forward();
    ++steps;
    int64_t tokens = 0;
    bool has_decode = false, has_prefill = false;
    std::vector<float> out;
    int used = 0;
    for (int s = 0; s < cache_.max_slots(); ++s) used += cache_.in_use(s) ? 1 : 0;
    max_used = std::max(max_used.load(), used);
    for (const auto& c : chunks) {
      if (!cache_.in_use(c.slot)) throw std::logic_error("chunk on a free slot");
      if (c.start_pos != cache_.num_tokens(c.slot)) throw std::logic_error("chunk does not continue its slot");
      if (c.tokens.empty() || c.start_pos + static_cast<int64_t>(c.tokens.size()) > cache_.max_seq_len()) {
        throw std::logic_error("bad chunk size");
      }
      if (cache_.blocks_needed(c.slot, c.start_pos + static_cast<int64_t>(c.tokens.size())) > 0) {
        throw std::logic_error("the scheduler did not reserve the chunk's blocks");
      }
    }
    for (const auto& c : chunks) {
      // The slot's tokens so far: the prefix-cache hit's or earlier steps' (kept by the cache), then the chunk.
      auto& hist = history_[static_cast<size_t>(c.slot)];
      hist.assign(cache_.tokens(c.slot).begin(), cache_.tokens(c.slot).end());
      hist.insert(hist.end(), c.tokens.begin(), c.tokens.end());
      cache_.prepare(c.slot, c.start_pos, static_cast<int64_t>(c.tokens.size()));
      cache_.commit(c.slot, c.start_pos, c.tokens);
      const auto logits = fake_logits(hist);
      out.insert(out.end(), logits.begin(), logits.end());
      tokens += static_cast<int64_t>(c.tokens.size());
      computed_tokens += static_cast<int64_t>(c.tokens.size());
      (c.tokens.size() == 1 ? has_decode : has_prefill) = true;
    }
    max_chunks = std::max<int64_t>(max_chunks.load(), static_cast<int64_t>(chunks.size()));
    max_tokens = std::max(max_tokens.load(), tokens);
    if (has_decode && has_prefill) ++mixed_steps;
    return out;
  }

  std::function<void()> before_forward;  ///< runs on the scheduler thread at the start of every step
  std::atomic<int64_t> steps{0}, max_chunks{0}, max_tokens{0}, mixed_steps{0}, computed_tokens{0};
  std::atomic<int> max_used{0};

 private:
  model::KvCache cache_;
  std::vector<std::vector<int32_t>> history_;
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
