// SPDX-License-Identifier: Apache-2.0
// What the scheduler needs from a model: a paged KV cache and one batched forward step. The production
// implementation (decoder_step_model.h) wraps model::Decoder + model::KvCache; tests drive the scheduler with a
// small deterministic model so that batching bookkeeping is checked independently of the kernels.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/kv_cache.h"

namespace fp4serve::server {

/// One sequence's share of a step: `tokens` at positions start_pos … start_pos + size − 1 of the sequence held
/// in `slot` (positions before start_pos are already cached).
struct StepChunk {
  int slot = -1;
  int64_t start_pos = 0;
  std::span<const int32_t> tokens;
};

/// Not thread-safe: only the scheduler thread calls it.
class StepModel {
 public:
  virtual ~StepModel() = default;
  virtual int64_t vocab_size() const = 0;
  /// The paged KV cache the steps run on: the scheduler acquires and releases its slots, matches prompts against
  /// its prefix cache and reserves blocks in it before each step.
  virtual model::KvCache& cache() = 0;
  virtual const model::KvCache& cache() const = 0;
  /// Positions one sequence may hold (the context length requests are checked against).
  int64_t max_seq_len() const { return cache().max_seq_len(); }
  /// Sequences held at once (the cache's slots).
  int max_slots() const { return cache().max_slots(); }
  /// Runs all chunks as one step and returns the logits of each chunk's last token, [chunks, vocab] fp32 in
  /// chunk order; the chunks' slots hold their positions before start_pos, and the step gives them the blocks
  /// for the rest (KvCache::prepare) and records their tokens (KvCache::commit), as model::ForwardModel::forward
  /// does. May throw; the scheduler then fails the sequences of this step and keeps serving.
  virtual std::vector<float> forward(std::span<const StepChunk> chunks) = 0;
};

}  // namespace fp4serve::server
