// SPDX-License-Identifier: Apache-2.0
// What the text side (runtime::generate, `generate`, `chat`) needs from a model: its config, a KV cache shaped
// for it, and the batched forward step. model::Decoder implements it on any model::Backend (CPU or GPU), so
// callers do not care where the model runs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/kv_cache.h"
#include "model/model_config.h"

namespace fp4serve::model {

/// One sequence's share of a forward step: `tokens` at positions start_pos … start_pos + size − 1 of the
/// sequence held in KV-cache `slot` (positions before start_pos must already be cached).
struct SequenceChunk {
  int slot = -1;
  int64_t start_pos = 0;
  std::span<const int32_t> tokens;
  bool all_logits = false;  ///< return logits for every token (perplexity), else for the last token only
  /// With all_logits: the first first_logit_row tokens return no logits (a perplexity window scores only the
  /// tokens past its overlap with the previous one, and their lm_head rows are not computed). In [0, size).
  int64_t first_logit_row = 0;
};

class ForwardModel {
 public:
  virtual ~ForwardModel() = default;
  virtual const ModelConfig& config() const = 0;
  /// A KV cache sized for this model (`spec`'s block pool), with its storage where this model's forward reads it
  /// (host or device). Throws UsageError on bad sizes, DeviceError when it does not fit.
  virtual KvCache make_cache(const KvCacheSpec& spec) const = 0;
  /// make_cache({max_seq_len, max_slots}): a pool that holds every slot at full length.
  KvCache make_cache(int64_t max_seq_len, int max_slots) const { return make_cache(KvCacheSpec{max_seq_len, max_slots}); }
  /// Runs the chunks through the model, appending their keys/values to the cache (each chunk's slot gets the
  /// blocks its positions need first: KvCache::prepare; after the step KvCache::commit records the tokens), and
  /// returns logits
  /// [rows, vocab] fp32 on the host where rows = Σ (all_logits ? chunk size − first_logit_row : 1), in chunk
  /// order. Throws UsageError when a chunk is empty, has first_logit_row outside [0, size), exceeds the cache
  /// length, names a slot twice or a token outside the vocabulary, when the cache runs out of blocks, or when `cache`
  /// was not made by this model's make_cache.
  virtual std::vector<float> forward(std::span<const SequenceChunk> batch, KvCache& cache) const = 0;
};

}  // namespace fp4serve::model
